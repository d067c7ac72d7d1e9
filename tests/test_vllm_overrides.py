"""The vLLM internals the plugin relies on (adapter/vllm_contract.py) against the installed vLLM, the
check's own failure message, and that no override of a vLLM method goes unlisted: an override
added without an entry in ``CONTRACT`` and a row in docs/vllm-overrides.md fails here."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import pytest
import vllm

from vllm_wedlm.adapter.vllm_contract import (
    CONTRACT,
    DOC,
    INPUT_BATCH_ATTRIBUTES,
    LAZY_MODULES,
    PINNED_VLLM,
    RUNNER_ATTRIBUTES,
    Member,
    VLLMContractError,
    check_runner_attributes,
    check_vllm_contract,
    params_of,
)

ROOT = Path(__file__).resolve().parents[1]

# Every module that subclasses a vLLM class (tests run on the CPU, so the CPU worker may be imported).
ADAPTER_MODULES = ("scheduler", "model_runner", "gpu_worker", "cpu_worker", "request_validator", "config_hook",
                   "metrics")
SUBCLASSING_MODULES = (*(f"vllm_wedlm.adapter.{name}" for name in ADAPTER_MODULES), "vllm_wedlm.models.wedlm")


def test_installed_vllm_matches(monkeypatch):
    """Every entry, the lazily checked ones included, through the plugin's own wrappers."""
    from vllm.v1.engine import async_llm

    from vllm_wedlm.adapter.metrics import use_for_wedlm_engines
    from vllm_wedlm.plugin import register_all

    for module in LAZY_MODULES:
        importlib.import_module(module)
    register_all()  # wraps EngineArgs' methods, as in every vLLM process
    monkeypatch.setattr(async_llm, "load_stat_logger_plugin_factories", async_llm.load_stat_logger_plugin_factories)
    use_for_wedlm_engines()  # replaced for this test only
    assert vllm.__version__.split("+")[0] == PINNED_VLLM
    check_vllm_contract()


class Base:
    def hook(self, request, new_token_ids):
        pass

    def moved(self, *, prefix=""):
        pass


class Changed(Base):
    def hook(self, request, new_token_ids, is_stale=False):  # vLLM 0.33's change of this kind
        pass


def test_a_difference_is_named():
    contract = {
        "stand_in:Changed": {
            "hook": Member("Base", ("self", "request", "new_token_ids")),
            "moved": Member("Changed", ("self", "*", "prefix")),  # inherited now: super() reaches Base's
            "gone": Member(None, ("self",)),
        },
        "stand_in:Base": {"hook": Member("Base", ("self", "request", "new_token_ids"))},  # as expected
    }
    with pytest.raises(VLLMContractError) as failure:
        check_vllm_contract(contract, targets={"stand_in:Changed": Changed, "stand_in:Base": Base})
    message = str(failure.value)
    assert "Changed.hook: parameters (self, request, new_token_ids, is_stale), expected (self, request, " \
           "new_token_ids)" in message
    assert "Changed.moved: now defined in Base, expected in Changed" in message
    assert "Changed.gone: missing" in message
    assert "Base.hook" not in message
    assert f"vLLM {PINNED_VLLM}" in message and vllm.__version__ in message and DOC in message
    check_vllm_contract({"stand_in:Base": contract["stand_in:Base"]}, targets={"stand_in:Base": Base})


def test_parameters_are_written_as_python_writes_them():
    def f(a, /, b, *args, c, **kwargs):
        pass

    def g(a, *, b):
        pass

    assert params_of(f) == ("a", "/", "b", "*args", "c", "**kwargs")
    assert params_of(g) == ("a", "*", "b")


def _is_vllm(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "vllm"


def _is_method(value: object) -> bool:
    """A method the plugin wrote or took from vLLM; not one Python's typing or abc machinery added
    (``typing.Protocol`` gives every subclass a ``__subclasshook__``)."""
    function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    function = function.fget if isinstance(function, property) else function
    return inspect.isfunction(function) and function.__module__.split(".")[0] in ("vllm", "vllm_wedlm")


def overrides() -> list[tuple[type, str, str, type]]:
    """(plugin class, contract key of the vLLM class it subclasses, method, the vLLM class that
    defines the method it overrides) for every method a plugin class or its mixins define that a
    vLLM class among its bases defines too."""
    found = []
    for module in map(importlib.import_module, SUBCLASSING_MODULES):
        for cls in vars(module).values():
            if not (inspect.isclass(cls) and cls.__module__ == module.__name__):
                continue
            vllm_classes = [k for k in cls.__mro__ if _is_vllm(k)]
            if not vllm_classes:
                continue
            base = vllm_classes[0]
            key = f"{base.__module__}:{base.__qualname__}"
            names = {name for k in cls.__mro__ if k.__module__.startswith("vllm_wedlm")
                     for name, value in vars(k).items() if _is_method(value)}
            for name in sorted(names):
                owner = next((k for k in vllm_classes if name in vars(k)), None)
                if owner is not None:
                    found.append((cls, key, name, owner))
    return found


def test_every_override_is_listed():
    found = overrides()
    assert len(found) > 30  # the modules were read
    unlisted = [f"{cls.__name__}.{name} (over {owner.__qualname__}.{name}: add it to CONTRACT[{key!r}])"
                for cls, key, name, owner in found if name not in CONTRACT.get(key, {})]
    assert not unlisted, "overrides of vLLM methods missing from adapter/vllm_contract.py: " + ", ".join(unlisted)
    wrong = [f"{cls.__name__}.{name}" for cls, key, name, owner in found
             if CONTRACT[key][name].defined_in != owner.__qualname__]
    assert not wrong, f"CONTRACT names the wrong defining vLLM class for {wrong}"


def test_every_entry_has_a_row_in_the_doc():
    doc = (ROOT / DOC).read_text()
    missing = []
    for key, members in CONTRACT.items():
        module, _, qualname = key.partition(":")
        for name, member in members.items():
            row = f"`{member.defined_in or qualname or module}.{name}`"
            if row not in doc:
                missing.append(row)
    assert not missing, f"no row in {DOC} for {missing}"
    assert "tests/test_vllm_overrides.py" in doc


def test_cpu_modules_are_checked_only_once_imported(monkeypatch):
    """gpu_worker.py runs the check at import, which must not import vLLM's CPU runner in a GPU
    process (it replaces torch.cuda.Stream and torch.Event process-wide)."""
    assert {"vllm.v1.worker.cpu_model_runner", "vllm.v1.worker.cpu_worker"} <= LAZY_MODULES
    monkeypatch.delitem(sys.modules, "vllm.v1.worker.cpu_worker", raising=False)  # put back after the test
    check_vllm_contract({"vllm.v1.worker.cpu_worker:CPUWorker": {"not_there": Member(None, None)}})
    assert "vllm.v1.worker.cpu_worker" not in sys.modules


def runner_reads() -> tuple[set[str], set[str]]:
    """The attributes of vLLM's runner and of its input batch that the adapter names: ``runner.X`` and
    ``self.runner.X`` in every module, ``self.X`` inside the runner mixin, ``input_batch.X`` anywhere;
    less what the mixin defines itself (its methods and the ``wedlm_`` attributes it sets)."""
    import ast

    from vllm_wedlm.adapter.model_runner import WeDLMRunnerMixin

    own = set(vars(WeDLMRunnerMixin))
    runner, batch = set(), set()
    for path in sorted((ROOT / "vllm_wedlm" / "adapter").glob("*.py")):
        tree = ast.parse(path.read_text())
        mixin = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "WeDLMRunnerMixin"]
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            value = node.value
            if isinstance(value, ast.Name) and value.id == "runner" or (
                    isinstance(value, ast.Attribute) and value.attr == "runner"):
                runner.add(node.attr)
            elif isinstance(value, ast.Attribute) and value.attr == "input_batch":
                batch.add(node.attr)
        for node in ast.walk(mixin[0]) if mixin else ():
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                if isinstance(node.ctx, ast.Store):
                    own.add(node.attr)
                else:
                    runner.add(node.attr)
    return {name for name in runner - own if not name.startswith("wedlm_")} - {"model"}, batch


def test_every_runner_attribute_the_adapter_reads_is_checked():
    """The runner's instance attributes the adapter reads are checked at start-up
    (``check_runner_attributes``, which every engine of the suite runs), all of them and no more."""
    runner, batch = runner_reads()
    assert len(runner) > 15 and len(batch) > 8  # the modules were read
    assert runner == set(RUNNER_ATTRIBUTES), (sorted(runner - set(RUNNER_ATTRIBUTES)),
                                              sorted(set(RUNNER_ATTRIBUTES) - runner))
    assert batch == set(INPUT_BATCH_ATTRIBUTES), (sorted(batch - set(INPUT_BATCH_ATTRIBUTES)),
                                                  sorted(set(INPUT_BATCH_ATTRIBUTES) - batch))
    doc = (ROOT / DOC).read_text()
    assert "check_runner_attributes" in doc and all(f"`{name}`" in doc for name in RUNNER_ATTRIBUTES)


def test_a_missing_runner_attribute_is_named():
    from types import SimpleNamespace

    class Batch:
        pass

    batch = Batch()
    for name in INPUT_BATCH_ATTRIBUTES[1:]:
        setattr(batch, name, None)
    runner = SimpleNamespace(**{**dict.fromkeys(RUNNER_ATTRIBUTES[1:]), "input_batch": batch})
    with pytest.raises(VLLMContractError) as failure:
        check_runner_attributes(runner)
    message = str(failure.value)
    assert f"SimpleNamespace.{RUNNER_ATTRIBUTES[0]}: missing" in message
    assert f"Batch.{INPUT_BATCH_ATTRIBUTES[0]}: missing" in message and DOC in message
    setattr(batch, INPUT_BATCH_ATTRIBUTES[0], None)
    check_runner_attributes(SimpleNamespace(**{**dict.fromkeys(RUNNER_ATTRIBUTES), "input_batch": batch}))
