"""Every live request's WeDLM window, on the device, with a host copy of what scheduling needs.

Rows ("slots") are given to a request at its first window and taken back when it finishes, so a
preempted request keeps its window (vLLM drops it from the batch and re-prefills its committed
tokens later). The device half holds each planned window (``core.batch``); the host half holds,
per slot, what the last step's single device-to-host copy brought back: the planned window's input
ids in physical order, its physical order, length, committed run and mask count, and where it
starts. The runner reads the host half to lay out the next forward and to report committed tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from vllm_wedlm.core.batch import BatchPlan, WindowBatch, plan_windows, reopen
from vllm_wedlm.core.params import WeDLMParams, selection_values


@dataclass
class HostWindows:
    """The planned windows, as the host sees them ([S, ...] numpy arrays by slot)."""

    input_ids: np.ndarray  # [S, C] int64, physical order
    order: np.ndarray  # [S, C] int64, the slot fed at each physical row
    length: np.ndarray  # [S] int64
    num_commit: np.ndarray  # [S] int64
    num_masks: np.ndarray  # [S] int64
    committed_len: np.ndarray  # [S] int64, tokens before the window (its slot j is at committed_len + j)

    @staticmethod
    def zeros(slots: int, capacity: int) -> HostWindows:
        return HostWindows(*(np.zeros((slots, capacity), np.int64) for _ in range(2)),
                           *(np.zeros(slots, np.int64) for _ in range(4)))

    def grown(self, slots: int) -> HostWindows:
        grown = HostWindows.zeros(slots, self.input_ids.shape[1])
        for name, value in vars(self).items():
            getattr(grown, name)[: len(value)] = value
        return grown


#: Columns of one planned window in the device-to-host packet: ids, order, then three counts.
def packet_width(capacity: int) -> int:
    return 2 * capacity + 3


def window_packet(plan: BatchPlan) -> torch.Tensor:
    """[P, packet_width] int64: what the host keeps of each planned window (``HostWindows``)."""
    counts = torch.stack([plan.windows.length, plan.num_commit, plan.num_masks], dim=1)  # [P, 3]
    return torch.cat([plan.input_ids, plan.order, counts], dim=1)


class WindowTable:
    def __init__(self, capacity: int, mask_id: int, device: torch.device, slots: int = 64):
        self.capacity, self.mask_id, self.device = capacity, mask_id, device
        self.windows = WindowBatch.empty(slots, capacity, mask_id, device)  # planned windows
        self.entropy_threshold = torch.zeros(slots, dtype=torch.float32, device=device)  # [S] tau
        self.pos_penalty = torch.zeros(slots, dtype=torch.float32, device=device)  # [S] lambda
        # Where each planned window starts and its physical order, on the device too: the step of
        # fixed window rows (async scheduling) lays out the next forward from them, not from the host.
        self.committed_len = torch.zeros(slots, dtype=torch.long, device=device)  # [S]
        self.order = torch.zeros(slots, capacity, dtype=torch.long, device=device)  # [S, C]
        self.host = HostWindows.zeros(slots, capacity)
        self._free = list(range(slots - 1, -1, -1))

    @property
    def num_slots(self) -> int:
        """Rows of the table (it grows when a request finds none free)."""
        return len(self.pos_penalty)

    def allocate(self) -> int:
        if not self._free:
            self._grow()
        return self._free.pop()

    def set_params(self, slot: int, params: WeDLMParams) -> None:
        # Written as scalars: a tensor made on the device from Python numbers is a copy the host
        # waits for, behind the step in flight (two per request that starts).
        self.entropy_threshold[slot], self.pos_penalty[slot] = selection_values(params)

    def release(self, slot: int) -> None:
        self._free.append(slot)

    def _grow(self) -> None:
        # Inside a step (inference mode) too, the grown tensors keep the kind the table was made
        # with: the compiled window step's guards check it (adapter/window_step.py).
        old = self.num_slots
        with torch.inference_mode(self.windows.tokens.is_inference()):
            self.windows = WindowBatch.cat([self.windows, WindowBatch.empty(old, self.capacity, self.mask_id,
                                                                            self.device)])
            self.entropy_threshold = torch.cat([self.entropy_threshold, torch.zeros_like(self.entropy_threshold)])
            self.pos_penalty = torch.cat([self.pos_penalty, torch.zeros_like(self.pos_penalty)])
            self.committed_len = torch.cat([self.committed_len, torch.zeros_like(self.committed_len)])
            self.order = torch.cat([self.order, torch.zeros_like(self.order)])
        self.host = self.host.grown(2 * old)
        self._free.extend(range(2 * old - 1, old - 1, -1))

    def store(self, slots: torch.Tensor, plan: BatchPlan) -> torch.Tensor:
        """Keep ``plan`` ([P] windows) at ``slots`` ([P] int64, device); its [P, packet_width] packet."""
        self.windows.store(slots, plan.windows)
        return window_packet(plan)

    def keep(self, slots: torch.Tensor, windows: WindowBatch, order: torch.Tensor, committed_len: torch.Tensor) -> None:
        """Keep planned windows ([P]) at ``slots`` ([P] int64, device) with the device's own record of
        their physical order ([P, C]) and where they start ([P]): fixed window rows lay out the next
        forward from these, the host half is not written."""
        self.windows.store(slots, windows)
        self.committed_len[slots] = committed_len
        self.order[slots] = order

    def reopen(self, slots: torch.Tensor, at: torch.Tensor, window_size: torch.Tensor, committed_len: torch.Tensor,
               max_model_len: int, host_slots: np.ndarray | None = None) -> None:
        """Make the fill at ``at`` ([P]) of each window at ``slots`` ([P] int64, device) a mask again
        (a grammar rejected it: ``core.batch.reopen``) and plan the window anew, of W ``window_size``
        ([P]) after ``committed_len`` ([P]) tokens; the host half too where the layout keeps one
        (``host_slots`` [P], the same slots on the host: one more device-to-host copy)."""
        plan = plan_windows(reopen(self.windows.rows(slots), at, self.mask_id), window_size, committed_len,
                            max_model_len)
        self.keep(slots, plan.windows, plan.order, committed_len)
        if host_slots is not None:
            self.receive(host_slots, window_packet(plan).cpu().numpy(), committed_len.cpu().numpy())

    def start(self, slots: np.ndarray, plan: BatchPlan, committed_len: np.ndarray) -> None:
        """Keep ``plan`` ([P] windows, planned on the host) at ``slots`` ([P]), both halves."""
        index = torch.from_numpy(slots).to(self.device, non_blocking=True)
        self.windows.store(index, WindowBatch(*(getattr(plan.windows, name).to(self.device, non_blocking=True)
                                                for name in ("tokens", "filled", "length"))))
        self.committed_len[index] = torch.from_numpy(committed_len).to(self.device, non_blocking=True)
        self.order[index] = plan.order.to(self.device, non_blocking=True)
        self.receive(slots, window_packet(plan).numpy(), committed_len)

    def receive(self, slots: np.ndarray, packet: np.ndarray, committed_len: np.ndarray) -> None:
        """Write the host half of ``slots`` ([P]) from a packet that came back ([P, packet_width])."""
        c = self.capacity
        host = self.host
        host.input_ids[slots] = packet[:, :c]
        host.order[slots] = packet[:, c:2 * c]
        host.length[slots], host.num_commit[slots], host.num_masks[slots] = packet[:, 2 * c:].T
        host.committed_len[slots] = committed_len
