"""The training module against its specification (research/wedlm.md section 5), on small cases."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from vllm_wedlm.checkpoints import MICRO_CHECKPOINT
from vllm_wedlm.checkpoints.tiny import TinySpec, chat_tokenizer, config_for, random_model, train_bpe_tokenizer
from vllm_wedlm.training.data.tasks import KINDS, chat_prompt, final_answer, generate, mixture
from vllm_wedlm.training.masking import IGNORE, dual_stream_attention_mask, dual_stream_sample, mask_blocks
from vllm_wedlm.training.objective import collate, wedlm_losses
from vllm_wedlm.training.recipes import RECIPES
from vllm_wedlm.training.train import Vocabulary, chat_bpe_tokenizer, tokenize, train, training_samples

MASK = 99


def test_attention_mask_by_hand():
    # L = 4 tokens, blocks of 2: memory 0..3 (blocks 0 0 1 1), prediction 4..7 (blocks 0 0 1 1).
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],  # memory stays plain causal across blocks
        [1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0, 0],  # prediction block 0: no earlier memory, itself causally
        [0, 0, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 1, 0],  # prediction block 1: memory block 0, not its own memory
        [1, 1, 0, 0, 0, 0, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(dual_stream_attention_mask(4, 2), expected)


def test_masking_by_hand():
    ids = torch.tensor([10, 11, 12, 13, 14, 15, 16])
    maskable = torch.tensor([False, False, True, True, True, True, True])  # two prompt tokens
    generator = torch.Generator().manual_seed(0)
    # gamma 1 masks every maskable token of block 0 (only 12); gamma 0.5 masks 2 of block 1's 4;
    # the last block (16 alone) gets gamma 1e-8, clamped up from 0, so nothing.
    tokens, positions, targets, weights = mask_blocks(
        ids, maskable, 3, MASK, generator, gammas=torch.tensor([1.0, 0.5, 0.0])
    )
    assert tokens[:3].tolist() == [10, 11, MASK] and positions[:3].tolist() == [0, 1, 2]
    assert targets[:3].tolist() == [IGNORE, IGNORE, 12] and weights[:3].tolist() == [0.0, 0.0, 1.0]
    block = slice(3, 6)
    masked = tokens[block] == MASK
    assert masked.tolist() == [False, True, True]  # one observed, then the two masks
    assert sorted(positions[block].tolist()) == [3, 4, 5]
    assert positions[4] < positions[5]
    assert tokens[3] == ids[positions[3]]  # the observed token keeps its id and its position
    assert targets[block][masked].tolist() == ids[positions[block][masked]].tolist()
    assert weights[block].tolist() == [0.0, 2.0, 2.0]  # 1 / gamma
    assert tokens[6:].tolist() == [16] and targets[6:].tolist() == [IGNORE]


def test_tail_masking_masks_the_last_maskable_tokens_of_each_block():
    """suffix_prob 1: each block masks a contiguous tail of its answer tokens (what an inference
    window looks like), so the order is unchanged; suffix_prob 0 keeps the random subsets and the
    very same random stream as before the option existed."""
    ids = torch.arange(100, 124)
    maskable = torch.arange(24) >= 3  # three prompt tokens in block 0
    gammas = torch.tensor([0.5, 0.25, 0.75])
    tokens, positions, targets, _ = mask_blocks(ids, maskable, 8, MASK, torch.Generator().manual_seed(0),
                                                gammas=gammas, suffix_prob=1.0)
    assert positions.tolist() == list(range(24))  # a tail is already observed-first
    masked = (tokens == MASK).view(3, 8)
    # Block 0: round(0.5 * 5) = 2 of its 5 answer tokens; block 1: 2 of 8; block 2: 6 of 8.
    assert masked[0].tolist() == [False] * 6 + [True] * 2
    assert masked[1].tolist() == [False] * 6 + [True] * 2
    assert masked[2].tolist() == [False] * 2 + [True] * 6
    assert targets[tokens == MASK].tolist() == ids[tokens == MASK].tolist()

    plain = mask_blocks(ids, maskable, 8, MASK, torch.Generator().manual_seed(3), gammas=gammas)
    off = mask_blocks(ids, maskable, 8, MASK, torch.Generator().manual_seed(3), gammas=gammas, suffix_prob=0.0)
    assert all(torch.equal(a, b) for a, b in zip(plain, off, strict=True))
    tails = 0
    generator = torch.Generator().manual_seed(4)
    for _ in range(200):
        tokens, positions, _, _ = mask_blocks(ids, maskable, 8, MASK, generator, gammas=gammas, suffix_prob=0.5)
        tails += sorted(positions[8:16][tokens[8:16] == MASK].tolist()) == [14, 15]  # logical, not physical
    # Half the blocks are tails; a random pair of 8 is the tail 1 time in 28 otherwise.
    assert 80 <= tails <= 125, tails


def test_prompt_tokens_are_never_masked():
    ids = torch.arange(40, 80)
    maskable = torch.arange(40) >= 25
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        tokens, positions, _, _ = mask_blocks(ids, maskable, 8, MASK, generator, gammas=torch.ones(5))
        assert (tokens[positions < 25] != MASK).all()
        assert (tokens[positions >= 25] == MASK).all()


def test_dual_stream_sample_layout():
    ids = torch.tensor([5, 6, 7, 8])
    maskable = torch.tensor([False, True, True, True])
    sample = dual_stream_sample(ids, maskable, 2, MASK, torch.Generator().manual_seed(0))
    assert sample.input_ids[:4].tolist() == [5, 6, 7, 8]  # memory stream: clean, in order
    assert sample.position_ids[:4].tolist() == [0, 1, 2, 3]
    assert sorted(sample.position_ids[4:].tolist()) == [0, 1, 2, 3]
    # AR loss: memory row i predicts token i+1 when it is a response token (not the prompt).
    assert sample.ar_targets.tolist() == [6, 7, 8, IGNORE] + [IGNORE] * 4
    assert (sample.mlm_targets[:4] == IGNORE).all()


def test_prediction_rows_see_what_an_inference_window_sees():
    """The dual-stream forward of a mask row equals a plain causal forward over [clean prefix of
    the earlier blocks] + [the reordered block], the sequence the engine forwards at inference."""
    spec = TinySpec(variant="qwen3", vocab_target=300, num_hidden_layers=2)
    tokenizer = train_bpe_tokenizer(["1, 2, 3, 4, 5, 6, 7, 8, 9."] * 50, 300)
    model = random_model(spec, config_for(spec, tokenizer)).eval()
    mask_id, block = tokenizer.token_to_id("<|mask|>"), 4
    ids = torch.randint(0, 250, (11,))
    maskable = torch.arange(11) >= 2
    batch = collate([(ids, maskable)], block_size=block, mask_token_id=mask_id, pad_token_id=0,
                    generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        hidden = model.model(input_ids=batch.input_ids, position_ids=batch.position_ids,
                             attention_mask=batch.attention_mask).last_hidden_state[0]
        for start in range(0, 11, block):
            width = min(block, 11 - start)
            rows = slice(11 + start, 11 + start + width)  # this block in the prediction stream
            window_ids = torch.cat([ids[:start], batch.input_ids[0, rows]])
            window_pos = torch.cat([torch.arange(start), batch.position_ids[0, rows]])
            plain = model.model(input_ids=window_ids[None], position_ids=window_pos[None]).last_hidden_state[0]
            torch.testing.assert_close(hidden[rows], plain[start:], atol=1e-5, rtol=1e-5)


def test_padding_changes_nothing():
    """Real rows of a padded sample equal a forward of the same sample with the padding cut out."""
    spec = TinySpec(variant="qwen2", vocab_target=300)
    tokenizer = train_bpe_tokenizer(["a b c d e f g"] * 50, 300)
    model = random_model(spec, config_for(spec, tokenizer)).eval()
    pad_id = tokenizer.token_to_id("<|endoftext|>")
    short = (torch.randint(0, 250, (7,)), torch.arange(7) >= 2)
    long = (torch.randint(0, 250, (13,)), torch.arange(13) >= 3)
    batch = collate([short, long], block_size=4, mask_token_id=tokenizer.token_to_id("<|mask|>"),
                    pad_token_id=pad_id, generator=torch.Generator().manual_seed(5))
    real = torch.cat([torch.arange(13) < 7, batch.position_ids[0, 13:] < 7])  # [26] the short sample's rows
    assert (batch.input_ids[0, ~real] == pad_id).all() and (batch.mlm_targets[0, ~real] == IGNORE).all()
    with torch.no_grad():
        padded = model.model(input_ids=batch.input_ids, position_ids=batch.position_ids,
                             attention_mask=batch.attention_mask).last_hidden_state[0]
        cut = model.model(input_ids=batch.input_ids[0, real][None], position_ids=batch.position_ids[0, real][None],
                          attention_mask=batch.attention_mask[0, 0][real][:, real][None, None]).last_hidden_state[0]
    torch.testing.assert_close(padded[real], cut, atol=1e-5, rtol=1e-5)


def test_tasks_are_deterministic_disjoint_and_verifiable():
    for kind in KINDS:
        train_tasks, test_tasks = generate(kind, "train", 60), generate(kind, "test", 20)
        assert train_tasks == generate(kind, "train", 60)
        assert len(test_tasks) == 20
        assert not {t.prompt for t in train_tasks} & {t.prompt for t in test_tasks}
    for task in generate("arithmetic", "test", 50):
        assert final_answer(task.response) == task.answer
        assert int(task.answer) >= 0


def test_a_short_training_run_lowers_both_losses():
    recipe = RECIPES["micro"].with_overrides(steps=40, batch_size=8, warmup_steps=5)
    tasks = mixture({"counting": 100, "arithmetic": 100}, "train")
    tokenizer = chat_bpe_tokenizer(tasks, 400)
    vocab = Vocabulary.of_tokenizer(chat_tokenizer(tokenizer))
    samples = [tokenize(t, vocab, recipe) for t in tasks]
    model = random_model(recipe.model, config_for(recipe.model, tokenizer))
    history = train(model, samples, vocab, recipe, device=torch.device("cpu"), log=lambda line: None, log_every=10)
    first, last = history[0], history[-1]
    assert last["mlm"] < 0.8 * first["mlm"] and last["ar"] < 0.8 * first["ar"], history
    # And the loss of a fresh batch agrees: the model learned, not just the batches it saw.
    batch = collate(samples[:8], block_size=32, mask_token_id=vocab.mask_token_id,
                    pad_token_id=vocab.pad_token_id, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        losses = wedlm_losses(model.eval(), batch)
    assert losses.ar.item() < 0.8 * first["ar"] and losses.mlm.item() < 0.8 * first["mlm"]


def test_mlm_weightings_by_hand():
    """inverse_gamma: sum(ce / gamma) / sum(1 / gamma) over masked rows; uniform: their plain mean."""
    spec = TinySpec(variant="qwen3", vocab_target=300)
    tokenizer = train_bpe_tokenizer(["a b c d e f g"] * 50, 300)
    model = random_model(spec, config_for(spec, tokenizer)).eval()
    ids, maskable = torch.randint(0, 250, (24,)), torch.arange(24) >= 2
    batch = collate([(ids, maskable)], block_size=8, mask_token_id=tokenizer.token_to_id("<|mask|>"),
                    pad_token_id=0, generator=torch.Generator().manual_seed(4))
    rows = batch.mlm_targets != IGNORE
    weights = batch.mlm_weights[rows]
    assert weights.unique().numel() > 1  # blocks drew different gammas, so the two schemes differ
    with torch.no_grad():
        hidden = model.model(input_ids=batch.input_ids, position_ids=batch.position_ids,
                             attention_mask=batch.attention_mask).last_hidden_state
        ce = torch.nn.functional.cross_entropy(model.lm_head(hidden[rows]), batch.mlm_targets[rows], reduction="none")
        inverse = wedlm_losses(model, batch, mlm_weighting="inverse_gamma").mlm
        uniform = wedlm_losses(model, batch, mlm_weighting="uniform").mlm
    torch.testing.assert_close(inverse, (ce * weights).sum() / weights.sum())
    torch.testing.assert_close(uniform, ce.mean())
    assert not torch.isclose(inverse, uniform)


def test_recipes_check_the_weighting_and_oversample_repeats_chats():
    with pytest.raises(ValueError, match="mlm_weighting"):
        RECIPES["micro"].with_overrides(mlm_weighting="linear")
    recipe = RECIPES["micro"].with_overrides(oversample={"counting": 3}, max_length=128)
    tasks = mixture({"counting": 5, "arithmetic": 5}, "train", max_number=20)
    samples = training_samples(tasks, Vocabulary.of_tokenizer(chat_tokenizer(chat_bpe_tokenizer(tasks, 400))), recipe)
    assert len(samples) == 3 * 5 + 5
    counted = sum(1 for ids, _ in samples for other, _ in samples if torch.equal(ids, other))
    assert counted == 5 * 3 * 3 + 5  # each counting chat equals itself and its two copies


def test_training_prompts_are_the_chat_template_of_the_checkpoint():
    """Training renders a task with the chat template its checkpoint carries, which vLLM's chat
    endpoints apply at inference: the shipped micro checkpoint's template gives the ChatML text
    the micro model was trained on, token for token."""
    micro = AutoTokenizer.from_pretrained(MICRO_CHECKPOINT)
    vocab = Vocabulary.of_tokenizer(micro)
    for task in generate("arithmetic", "train", 3, max_number=20) + generate("counting", "test", 3, max_number=20):
        chatml = f"<|im_start|>user\n{task.prompt}<|im_end|>\n<|im_start|>assistant\n"
        assert vocab.prompt(task) == chat_prompt(micro, task) == chatml
        assert vocab.encode(chatml) == micro.apply_chat_template(
            task.messages(with_response=False), add_generation_prompt=True, tokenize=True, return_dict=False)


def test_the_micro_checkpoint_has_the_tokenizer_its_recipe_trains():
    """The shipped micro tokenizer is what the micro recipe learns from its chats, and the
    training vocabulary of that tokenizer is the checkpoint's own (its mask, padding, end of turn)."""
    recipe = RECIPES["micro"]
    tasks = mixture(recipe.task_counts, "train", recipe.seed, recipe.max_number)
    tokenizer = chat_bpe_tokenizer(tasks, recipe.vocab_target)
    assert json.loads(tokenizer.to_str()) == json.loads((MICRO_CHECKPOINT / "tokenizer.json").read_text())
    vocab, shipped = Vocabulary.of_tokenizer(chat_tokenizer(tokenizer)), Vocabulary.of_tokenizer(
        AutoTokenizer.from_pretrained(MICRO_CHECKPOINT))
    config = json.loads((MICRO_CHECKPOINT / "config.json").read_text())
    assert vocab.mask_token_id == shipped.mask_token_id == config["mask_token_id"]
    assert (vocab.pad_token_id, vocab.im_end_id) == (shipped.pad_token_id, shipped.im_end_id)
