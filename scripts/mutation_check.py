"""Do the tests fail when what they protect breaks? Deliberate bugs, one at a time.

    python scripts/mutation_check.py --out=results/mutation.json   # every mutant
    python scripts/mutation_check.py --only derangement   # mutants whose name contains this
    python scripts/mutation_check.py --list               # the mutants and their tests

Each mutant is one small edit to the library that breaks a promise dynjax makes (the audit's
interventions and statistics, causal routing, data splits and batches, replay, the training
loop; ``--list`` names each promise), with the test files that should catch it. The tree is
copied once (``git ls-files``, so uncommitted edits come along), each mutant is applied to the
copy, its tests run with the copy first on the import path (``-x``: the first failure kills
it), and the file is restored. A mutant the tests pass is a *survivor*: a promise no test
protects. Before any mutant, the unmutated copy must pass every listed file, so a survivor
cannot be a broken baseline. Exits 1 if any mutant survived.

A mutant whose text no longer occurs exactly once in its file is reported ``stale`` (the
code moved): update the list rather than the library.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    path: str       # relative to the repo root
    old: str        # must occur exactly once in the file
    new: str
    tests: tuple    # pytest arguments: files or node ids
    breaks: str     # the promise this edit breaks


AUDIT_TESTS = ("tests/test_audit_interventions.py",)
STATS_TESTS = ("tests/test_audit_stats.py",)
FAULTS = "tests/test_faults.py::"
FORMATS = "tests/test_hf_formats.py::"

MUTANTS = (
    Mutant("derangement_allows_fixed_points", "dynjax/audit/interventions.py",
           "return jnp.any(state[1] == idx)", "return jnp.any(state[1] < 0)", AUDIT_TESTS,
           "cross-input gives no example its own coefficients"),
    Mutant("token_shuffle_shared_across_examples", "dynjax/audit/interventions.py",
           'TOKEN_SHUFFLE_INDEPENDENT = ("layer", "stream", "example")',
           'TOKEN_SHUFFLE_INDEPENDENT = ("layer", "stream")', AUDIT_TESTS,
           "token shuffle draws an independent permutation per example"),
    Mutant("means_over_evaluation_not_calibration", "dynjax/audit/interventions.py",
           "    source = coeffs if calib is None else calib\n    if calib is not None:\n"
           "        check(calib, schema)\n\n    def one(axes: Axes, a, c):\n        dims",
           "    source = coeffs\n    if calib is not None:\n"
           "        check(calib, schema)\n\n    def one(axes: Axes, a, c):\n        dims",
           AUDIT_TESTS, "static profiles are means over the calibration set, never the "
           "evaluation inputs"),
    Mutant("global_mean_per_leaf", "dynjax/audit/interventions.py",
           "return jnp.full(a.shape, global_mean, a.dtype)",
           "return jnp.broadcast_to(_float_mean(c, None), a.shape).astype(a.dtype)",
           AUDIT_TESTS, "GlobalMean is one scalar for every gate leaf (the depth profile is "
           "flattened)"),
    Mutant("layer_position_mean_also_over_tokens", "dynjax/audit/interventions.py",
           'return mean_over(coeffs, schema, ("example",), calib)',
           'return mean_over(coeffs, schema, ("example", "token"), calib)', AUDIT_TESTS,
           "Layer×PositionMean keeps the position axis"),
    Mutant("retention_mean_of_ratios", "dynjax/audit/stats.py",
           "est = float(retention(s.mean(), r.mean())) if n else np.nan",
           "est = float(np.mean(retention(s, r))) if n else np.nan", STATS_TESTS,
           "retention is the ratio of means"),
    Mutant("holm_not_applied", "dynjax/audit/stats.py",
           'out[ok] = multipletests(p[ok], method="holm")[1]', "out[ok] = p[ok]", STATS_TESTS,
           "p-values are Holm-adjusted"),
    Mutant("sign_flip_one_sided", "dynjax/audit/stats.py",
           'alternative="two-sided"', 'alternative="greater"', STATS_TESTS,
           "the sign-flip test is two-sided"),
    Mutant("crossed_bootstrap_one_tail", "dynjax/audit/stats.py",
           "alpha = (1 - level) / 2", "alpha = 1 - level", STATS_TESTS,
           "a 95% interval leaves 2.5% in each tail"),
    Mutant("small_criterion_reads_estimate", "dynjax/audit/stats.py",
           'hi = summary["ci_high"]', 'hi = summary["estimate"]', STATS_TESTS,
           "'practically small' reads the CI's upper bound, not the estimate"),
    Mutant("combine_drops_a_checkpoint", "dynjax/audit/summary.py",
           'entries = [c for p in parts for c in p["meta"]["checkpoints"]]',
           'entries = [c for p in parts for c in p["meta"]["checkpoints"]][:-1] or '
           '[c for p in parts for c in p["meta"]["checkpoints"]]',
           ("tests/test_audit_run.py",), "a combined audit holds every seed, as one joint "
           "audit does"),
    Mutant("causal_routing_sees_the_future", "dynjax/models/mod.py",
           "idx, valid = first_k_slots(asked, decode_slots(cfg, T))",
           "idx, valid = top_idx, top_valid", ("tests/test_mod.py",),
           "causal routing decides token t from tokens <= t"),
    Mutant("mod_capacity_rounds_up", "dynjax/models/mod.py",
           "k = int(math.floor(cfg.mod.capacity * seq_len + 1e-9))",
           "k = int(math.ceil(cfg.mod.capacity * seq_len - 1e-9))", ("tests/test_mod.py",),
           "a MoD block processes k = floor(c * T) tokens"),
    Mutant("router_weight_scales_the_residual", "dynjax/models/mod.py",
           "new = jnp.where(valid[..., None], x + w * update, x)",
           "new = jnp.where(valid[..., None], w * (x + update), x)", ("tests/test_mod.py",),
           "the router weight multiplies the block's update, never the residual"),
    Mutant("headline_is_non_causal", "dynjax/train/evaluation.py",
           "causal = [r for r, (_, is_causal) in routes.items() if is_causal]",
           "causal = [r for r, (_, is_causal) in routes.items() if not is_causal]",
           ("tests/test_mod.py",), "a routed model's headline figure is a causal rule"),
    Mutant("replay_ignores_given_coefficients", "dynjax/coeffs.py",
           "jnp.where(given.replay, v.astype(c.dtype), c)",
           "jnp.where(given.replay & False, v.astype(c.dtype), c)", ("tests/test_replay.py",),
           "replay uses the given coefficients verbatim"),
    Mutant("splits_overlap", "dynjax/data/text.py",
           "zip(SPLITS, (0, *cuts[:-1]), cuts)", "zip(SPLITS, (0, *(cuts[:-1] - 64)), cuts)",
           ("tests/test_data.py",), "train, validation and test bytes do not overlap"),
    Mutant("batches_ignore_the_seed", "dynjax/data/text.py",
           "rng = np.random.default_rng([seed, step])", "rng = np.random.default_rng([0, step])",
           ("tests/test_data.py",), "each seed trains on its own stream "
           "of batches"),
    Mutant("host_reads_the_first_rows", "dynjax/data/text.py",
           "starts = starts[rows]", "starts = starts[:len(starts[rows])]",
           ("tests/test_multihost.py::test_two_processes_equal_one",),
           "each host reads its own rows of the global batch"),
    Mutant("moe_priority_by_position", "dynjax/models/moe.py",
           "    if by_position:   # a token's", "    if True:   # a token's",
           ("tests/test_moe.py",), "GShard priority: every first choice takes a buffer slot before any second choice"),
    Mutant("load_balance_reads_probs_twice", "dynjax/models/moe.py",
           "top1.mean((0, 1)) * probs.mean((0, 1))", "probs.mean((0, 1)) * probs.mean((0, 1))",
           ("tests/test_moe.py",), "the Switch load-balance loss is E * sum_e f_e P_e"),
    Mutant("mudd_mix_drops_the_last_source", "dynjax/models/muddpythia.py",
           "for s in range(1, len(sources)):", "for s in range(1, len(sources) - 1):",
           ("tests/test_muddpythia.py",), "MUDDPythia equals the official PyTorch code"),
    Mutant("reassigned_rows_of_the_wrong_window", "dynjax/audit/engine.py",
           "rows = self.programs.take(stack, r_idx, w_idx)",
           "rows = self.programs.take(stack, r_idx, (w_idx + 1) % W)",
           ("tests/test_replay.py",),
           "window w is replayed with its own reassigned coefficients"),
    Mutant("resume_restarts_the_step_count", "dynjax/train/loop.py",
           'start = int(state["step"])', "start = 0", ("tests/test_train.py",),
           "a resumed run continues from its checkpoint's step"),
    Mutant("final_checkpoint_not_forced", "dynjax/train/loop.py",
           "force=done == tc.steps or stopping)", "force=stopping)",
           ("tests/test_train.py",),
           "the last step is always checkpointed"),
    Mutant("evaluation_counts_padding", "dynjax/train/evaluation.py",
           "nlls.append(nll[:len(chunk)])", "nlls.append(nll)", ("tests/test_train.py",),
           "evaluation averages over the real windows, not the padded batch"),
    Mutant("per_token_mixes_batch_and_time", "dynjax/models/transformer.py",
           "return y.reshape(x.shape[:2] + y.shape[1:])",
           "return y.reshape((x.shape[1], x.shape[0]) + y.shape[1:]).swapaxes(0, 1)",
           ("tests/test_perf.py::test_per_token_projections_train_like_3d",),
           "per-token projections compute what the 3-D form does"),
    Mutant("nll_scores_the_current_token", "dynjax/models/transformer.py",
           "tokens[:, 1:, None], axis=-1)[..., 0]", "tokens[:, :-1, None], axis=-1)[..., 0]",
           ("tests/test_gates.py",), "the loss is next-token prediction"),
    # sampling (dynjax/decoding/sampling.py, decoding.stream)
    Mutant("nucleus_stops_short_of_p", "dynjax/decoding/sampling.py",
           "before = jnp.cumsum(probs, axis=-1) - probs", "before = jnp.cumsum(probs, axis=-1)",
           ("tests/test_sampling.py",), "top-p keeps the smallest set whose mass reaches p"),
    Mutant("stream_reuses_the_first_key", "dynjax/decoding/__init__.py",
           "cache, tok = step(params, cache, tok, t, keys[i + 1])",
           "cache, tok = step(params, cache, tok, t, keys[i])",
           ("tests/test_sampling.py",), "streamed sampling draws the tokens generate draws"),
    Mutant("sampling_ignores_temperature", "dynjax/decoding/sampling.py",
           "scaled = logits.astype(jnp.float32) / sampling.temperature",
           "scaled = logits.astype(jnp.float32)",
           ("tests/test_sampling.py",), "temperature sharpens or flattens the distribution"),
    # Hugging Face ports (dynjax/loaders/hf.py + archs/, dynjax/models/llm.py + components/):
    # parity with transformers
    Mutant("hf_mixtral_not_renormalised", "dynjax/loaders/archs/mixtral.py",
           'base["intermediate_size"], norm_topk_prob=True)',
           'base["intermediate_size"], norm_topk_prob=False)',
           ("tests/test_hf.py::test_logits_match_transformers[mixtral]",),
           "Mixtral renormalises its top-k router probabilities"),
    Mutant("hf_olmoe_ignores_norm_topk_prob", "dynjax/loaders/archs/olmoe.py",
           'norm_topk_prob=bool(hf["norm_topk_prob"])', 'norm_topk_prob=False',
           ("tests/test_hf.py::test_logits_match_transformers[olmoe]",),
           "OLMoE follows config.json's norm_topk_prob"),
    Mutant("hf_qwen2_moe_ignores_shared_gate", "dynjax/models/llm.py",
           'y = y + used["shared_gate"].astype(dt)[..., None] * swiglu(p["shared"], x, dt)',
           'y = y + swiglu(p["shared"], x, dt)',
           ("tests/test_hf.py::test_logits_match_transformers[qwen2_moe]",),
           "Qwen2-MoE's shared expert is scaled by its sigmoid gate"),
    Mutant("hf_rope_theta_ignored", "dynjax/loaders/archs/common.py",
           'out = {"rope_theta": float(theta), "rope_type": kind,',
           'out = {"rope_theta": 10000.0, "rope_type": kind,',
           ("tests/test_hf.py::test_logits_match_transformers[qwen3]",),
           "the rotary base follows config.json (rope_theta / rope_parameters)"),
    Mutant("hf_llama3_rope_scaling_ignored", "dynjax/models/components/rotary.py",
           'if cfg.rope_type == "llama3":', "if False:",
           ("tests/test_hf.py::test_logits_match_transformers[llama]",),
           "Llama 3.1's rotary frequency scaling is applied"),
    Mutant("hf_gqa_groups_interleaved", "dynjax/models/components/attention.py",
           "k, v = jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2)",
           "k, v = jnp.tile(k, (1, 1, group, 1)), jnp.tile(v, (1, 1, group, 1))",
           ("tests/test_hf.py::test_logits_match_transformers[llama]",),
           "each key/value head serves its own consecutive group of query heads"),
    Mutant("hf_olmoe_qk_norm_per_head", "dynjax/models/components/attention.py",
           'q = norms.rms_norm(q, p["q_norm"], eps, axes=(-2, -1))',
           'q = norms.rms_norm(q, p["q_norm"], eps, axes=(-1,))',
           ("tests/test_hf.py::test_logits_match_transformers[olmoe]",),
           "OLMoE's q norm spans all heads"),
    Mutant("hf_olmoe_clip_ignored", "dynjax/models/components/attention.py",
           "if cfg.clip_qkv is not None:", "if False:",
           ("tests/test_hf.py::test_logits_match_transformers[olmoe]",),
           "OLMoE clamps q, k, v to clip_qkv"),
    Mutant("hf_replay_recomputes_the_router", "dynjax/models/llm.py",
           'experts, weights = route(cfg, used["router"], p)',
           'experts, weights = route(cfg, computed["router"], p)',
           ("tests/test_hf.py::test_replay_is_bitwise_and_uses_the_given_scores",),
           "replay selects experts and weights from the given router scores"),
    Mutant("hf_windows_overlap", "dynjax/loaders/hf.py",
           '("evaluation", "test", n_evaluation)', '("evaluation", "validation", n_evaluation)',
           ("tests/test_hf.py::test_token_windows_are_deterministic_disjoint_and_in_vocab",),
           "calibration and evaluation windows come from disjoint text"),
    Mutant("hf_extra_tensors_ignored", "dynjax/loaders/hf.py",
           "        if extra:\n", "        if False:\n",
           ("tests/test_hf.py::test_shape_mismatch_and_extra_tensors_are_one_line",),
           "a checkpoint with tensors the port does not use is refused, not half-loaded"),
    # reading HF checkpoints (dynjax/loaders/tensors.py): formats, skips, dtype, broken files
    Mutant("fp8_scale_transposed", "dynjax/loaders/tensors.py",
           "    s = scale_inv.astype(np.float32)\n",
           "    s = np.swapaxes(scale_inv, -1, -2).astype(np.float32)\n",
           (FORMATS + "test_block_fp8_equals_transformers_dequantisation",
            FORMATS + "test_fp8_checkpoint_loads_to_transformers_logits"),
           "FP8 scale_inv[i, j] scales row block i and column block j"),
    Mutant("fp8_block_from_the_shapes", "dynjax/loaders/tensors.py",
           "(N, K), (sn, sk), (bn, bk) = w.shape[-2:], s.shape[-2:], block",
           "(N, K), (sn, sk) = w.shape[-2:], s.shape[-2:]; bn, bk = -(-N // sn), -(-K // sk)",
           (FORMATS + "test_block_fp8_equals_transformers_dequantisation",),
           "FP8 blocks are weight_block_size, the last one short (not rows / scale rows)"),
    Mutant("mxfp4_nibbles_swapped", "dynjax/loaders/tensors.py",
           "    out[..., 0] = FP4_E2M1[b & 0x0F]\n    out[..., 1] = FP4_E2M1[b >> 4]\n",
           "    out[..., 0] = FP4_E2M1[b >> 4]\n    out[..., 1] = FP4_E2M1[b & 0x0F]\n",
           (FORMATS + "test_mxfp4_equals_transformers_dequantisation",),
           "MXFP4's low nibble is the first of its two values"),
    Mutant("mxfp4_e8m0_bias", "dynjax/loaders/tensors.py",
           "exponent = scales.view(np.uint8).astype(np.int32) - 127",
           "exponent = scales.view(np.uint8).astype(np.int32) - 128",
           (FORMATS + "test_mxfp4_equals_transformers_dequantisation",),
           "MXFP4 scales are 2 ** (byte - 127)"),
    Mutant("torch_dtype_ignored", "dynjax/loaders/tensors.py",
           'if stored in ("bfloat16", "float32"):', 'if stored in ("float32",):',
           (FORMATS + "test_torch_dtype_is_the_default",),
           "a bf16 checkpoint loads as bf16 unless the caller asks otherwise"),
    Mutant("mtp_layers_not_skipped", "dynjax/loaders/tensors.py",
           "int(m.group(1)) >= int(", "int(m.group(1)) > int(",
           (FORMATS + "test_mtp_layers_and_towers_are_skipped_with_one_line",),
           "multi-token-prediction layers (model.layers.{n_layers + i}) are skipped by name"),
    Mutant("vision_towers_not_skipped", "dynjax/loaders/tensors.py",
           "    if bare.startswith(_TOWERS):\n", "    if False:\n",
           (FORMATS + "test_mtp_layers_and_towers_are_skipped_with_one_line",),
           "vision towers of multimodal wrappers are skipped by name"),
    Mutant("prefix_not_rewritten", "dynjax/loaders/tensors.py",
           "            return new + name[len(old):]", "            return name",
           (FORMATS + "test_a_wrappers_text_model_is_read_through_its_prefix",),
           "a wrapper's text model is read through its declared prefix rewrite"),
    Mutant("tensors_not_sharded", "dynjax/loaders/hf.py",
           "dt, _leaf(shardings, path)))", "dt, None))",
           (FORMATS + "test_each_tensor_goes_to_its_device_shard",),
           "under a mesh each tensor is placed in its device shards as it is read"),
    Mutant("shards_memory_mapped", "dynjax/loaders/tensors.py",
           "        buf = np.empty(int(np.prod(shape)) * dtype.itemsize, np.uint8)\n",
           "        return np.memmap(self.path, dtype, 'r', self.base + start, shape)\n",
           (FORMATS + "test_no_shard_stays_mapped_or_open",),
           "tensors are read into memory one at a time, not mapped from the shards"),
    Mutant("programs_ignore_torch_dtype", "dynjax/runs/hf.py",
           'tensors.resolve_dtype(hf_config, windows.opt(section, "dtype"))',
           'tensors.resolve_dtype(hf_config, windows.opt(section, "dtype", "float32"))',
           (FORMATS + "test_programs_say_which_dtype_they_load",),
           "sample.py / audit.py --hf / scorecard.py --hf default to the checkpoint's dtype"),
    Mutant("truncated_shard_unchecked", "dynjax/loaders/tensors.py",
           "        if self.base + end > size:\n", "        if False:\n",
           (FORMATS + "test_broken_files_are_one_line_naming_the_file",),
           "a cut-short shard is one line naming it when the checkpoint is opened"),
    Mutant("damaged_index_traceback", "dynjax/loaders/tensors.py",
           "    except (ValueError, UnicodeDecodeError) as e:\n        raise CheckpointError(f\"{path} is damaged",
           "    except (UnicodeDecodeError,) as e:\n        raise CheckpointError(f\"{path} is damaged",
           (FORMATS + "test_broken_files_are_one_line_naming_the_file",),
           "a damaged model.safetensors.index.json is one line, not a JSONDecodeError"),
    Mutant("hf_decoding_cache_ignored", "dynjax/decoding/llm.py",
           'h = h + llm.attend(cfg, p["attn"], q, c["k"], c["v"], pos.index, c["pos"])',
           'h = h + llm.attend(cfg, p["attn"], q, k, v, pos.index, pos.index)',
           ("tests/test_hf.py::test_decoding_equals_the_forward",),
           "decoding attends over the cached keys and values"),
    Mutant("hf_unknown_model_type_falls_through", "dynjax/runs/target.py",
           "        _refuse_foreign(path)\n", "",
           ("tests/test_audit_hf.py::test_open_target_tells_hf_directories_apart",),
           "an HF folder of an unported model_type is refused, not opened as MUDDPythia"),
    Mutant("hf_arch_defaults_ignored", "dynjax/loaders/hf.py",
           "arch.config({**arch.defaults, **hf})", "arch.config({**hf})",
           ("tests/test_hf.py::test_every_module_of_the_registry_is_an_architecture",),
           "a field config.json omits takes the architecture's own transformers default"),
    # --- conversions (train.init_from: dynjax/train/convert.py) ---
    Mutant("upcycled_expert_not_copied_from_mlp", "dynjax/train/convert.py",
           "out[key] = (np.broadcast_to(mlp, init[key].shape) + noise",
           "out[key] = (init[key] + noise",
           ("tests/test_convert.py::test_copied_parameters_are_the_sources",),
           "every upcycled expert starts as the dense MLP"),
    Mutant("mod_router_init_zeros", "dynjax/train/convert.py",
           'fitted[(b, ("router", "proj", "kernel"))] = w[:, None].astype(np.float32)',
           'fitted[(b, ("router", "proj", "kernel"))] = np.zeros((len(w), 1), np.float32)',
           ("tests/test_convert.py::test_router_rule_ranks_tokens_by_their_update_not_by_ties",),
           "a converted MoD router ranks tokens by their update, not by ties"),
    Mutant("resume_converts_again", "dynjax/train/loop.py",
           "    state = checkpoint.restore_newest(mngr, target, run_dir)\n",
           "    state = checkpoint.restore_newest(mngr, target, run_dir)\n"
           "    state = state if source is None else source.convert(task, state)\n",
           ("tests/test_convert.py::test_resume_after_conversion_is_bitwise_and_does_not_convert_again",),
           "a resumed converted run restores its checkpoint and never converts again"),
    # --- conversions from Hugging Face (issue 29: convert.py, configs/llm_convert.py, llm.py) ---
    Mutant("hfconv_upcycle_copies_only_expert_0", "dynjax/train/convert.py",
           "np.broadcast_to(mlp, init[key].shape)", "np.concatenate([mlp[None], init[key][1:]])",
           ("tests/test_convert_hf.py::test_upcycled_experts_and_copies_are_the_sources_bitwise",),
           "every expert of an upcycled llm layer is its dense SwiGLU MLP"),
    Mutant("hfconv_upcycle_not_renormalised", "dynjax/configs/llm_convert.py",
           "norm_topk_prob=True, router_aux_loss_coef=0.01",
           "norm_topk_prob=False, router_aux_loss_coef=0.01",
           ("tests/test_convert_hf.py::test_upcycled_first_forward_is_the_dense_models_when_top_k_renormalises",),
           "the upcycled model's first forward is the dense model's (kept weights sum to 1)"),
    Mutant("hfconv_mod_ignores_the_fitted_router", "dynjax/train/convert.py",
           "        out.update(fitted)\n", "        pass\n",
           ("tests/test_convert_hf.py::test_fitted_router_ranks_tokens_by_their_update",),
           "a converted llm MoD router ranks tokens by the dense update's size (fitted, not seeded)"),
    Mutant("hfconv_mod_update_not_weighted", "dynjax/models/llm.py",
           "lambda r: mod_lib.router_weight(cfg, r))", "lambda r: jnp.ones_like(r))",
           ("tests/test_convert_hf.py::test_mod_with_every_token_entering_is_dense_up_to_the_router_weight",),
           "an llm MoD layer scales its update by the router weight"),
    Mutant("hfconv_mod_replay_recomputes_the_scores", "dynjax/models/llm.py",
           'scores = used["mod_router"]', 'scores = computed["mod_router"]',
           ("tests/test_convert_hf.py::test_mod_replay_is_bitwise_and_uses_the_given_scores",),
           "llm MoD replay selects tokens and weights from the given router scores"),
    Mutant("hfconv_load_balance_reads_probs_twice", "dynjax/models/llm.py",
           "return E * jnp.sum(share * probs.mean(",
           "return E * jnp.sum(probs.mean(axis=tuple(range(probs.ndim - 1))) * probs.mean(",
           ("tests/test_convert_hf.py::test_load_balance_is_switchs_and_one_when_balanced",),
           "the llm load-balancing loss is E * sum_e f_e P_e"),
    Mutant("hfconv_architecture_not_compared", "dynjax/train/convert.py",
           "for f in architecture(cfg) if getattr", "for f in architecture(cfg)[:0] if getattr",
           ("tests/test_convert_hf.py::test_train_cli_refuses_a_mismatched_hf_source_in_one_line",),
           "a target whose width, depth or heads differ from the HF source's is refused by name"),
    Mutant("hfconv_moe_source_into_dense_not_named", "dynjax/train/convert.py",
           "    if merged:\n", "    if False:\n",
           ("tests/test_convert_hf.py::test_an_moe_source_into_a_dense_or_mod_target_is_refused",),
           "an MoE source into a dense or MoD target is refused: experts do not merge back"),
    Mutant("hfconv_resume_reads_the_source", "dynjax/train/loop.py",
           "task = task_of(config)(convert.with_recorded_model(config, run_dir))",
           "task = task_of(config)(config)",
           ("tests/test_convert_hf.py::test_resume_of_an_hf_conversion_is_bitwise_and_needs_no_source",),
           "a resumed HF conversion takes its architecture from config.json, not the source"),
    # --- dropless MoE dispatch (dynjax/models/dispatch.py, moe.dropless_ffn; issue 27) ---
    Mutant("dropless_padding_rounds_down", "dynjax/models/dispatch.py",
           "sizes = (counts + block - 1) // block * block", "sizes = counts // block * block",
           ("tests/test_dispatch.py::test_dropless_equals_every_expert_on_every_token",),
           "each expert's rows fill whole blocks, so its last partial block is computed"),
    Mutant("dropless_combine_ignores_weights", "dynjax/models/dispatch.py",
           "w = jnp.where(live.reshape(N, k), weights, 0)",
           "w = jnp.where(live.reshape(N, k), 1.0, 0)",
           ("tests/test_dispatch.py::test_dropless_equals_every_expert_on_every_token",),
           "each expert's output is scaled by its combine weight"),
    Mutant("dropless_blocks_weight_grad_to_expert_0", "dynjax/models/dispatch.py",
           "return d_w.at[e].set(acc)", "return d_w.at[0].add(acc)",
           ("tests/test_dispatch.py::test_dropless_equals_every_expert_on_every_token",),
           "the CPU grouped matmul's weight gradient goes to each block's own expert"),
    Mutant("dropless_ragged_weight_grad_zero", "dynjax/models/dispatch.py",
           "_sum_to(d_w, w), None", "_sum_to(0 * d_w, w), None",
           ("tests/test_dispatch.py::test_ragged_dot_path_equals_blocks_path_under_vmap_and_grad",),
           "the ragged_dot path's gradient equals the CPU path's"),
    Mutant("dropless_noop_route_runs_an_expert", "dynjax/models/moe.py",
           "routes = experts if valid is None else",
           "routes = jnp.minimum(experts, E - 1) if valid is None else",
           ("tests/test_dispatch.py::test_model_equals_one_hot_that_never_drops",),
           "integrated MoDE's no-op route computes nothing"),
    Mutant("dropless_empty_slots_take_experts", "dynjax/models/moe.py",
           "jnp.where(valid[..., None], experts, -1)", "experts",
           ("tests/test_dispatch.py::test_staged_mode_causal_routing_equals_one_hot",),
           "staged MoDE's empty slots (tokens that did not enter) route to no expert"),
    Mutant("dropless_load_balance_per_token_not_per_route", "dynjax/models/moe.py",
           "counts.sum(0) / (k * B * T)", "counts.sum(0) / (B * T)",
           ("tests/test_dispatch.py::test_model_equals_one_hot_that_never_drops",),
           "the dropless load-balance loss equals the one-hot form's for top-k > 1"),
    # dispatch (issue 27)
    Mutant("llm_dropless_drops_the_last_expert", "dynjax/models/components/experts.py",
           "weights.astype(dt), E, kind.grouped,", "weights.astype(dt), E - 1, kind.grouped,",
           ("tests/test_hf.py::test_logits_match_transformers",),
           "the HF ports' dropless MoE sends every token to each of its k experts"),
    Mutant("llm_dropless_ignores_norm_topk_prob", "dynjax/models/components/routers.py",
           "    if cfg.norm_topk_prob:\n", "    if False:\n",
           ("tests/test_hf.py::test_logits_match_transformers",),
           "OLMoE / Qwen3-MoE / Mixtral renormalise their k weights (norm_topk_prob)"),
    Mutant("llm_dropless_always_renormalises", "dynjax/models/components/experts.py",
           "weights.astype(dt), E, kind.grouped,",
           "(weights / weights.sum(-1, keepdims=True)).astype(dt), E, kind.grouped,",
           ("tests/test_hf.py::test_logits_match_transformers",),
           "Qwen2-MoE (norm_topk_prob false) keeps its k softmax weights as they are"),
    Mutant("llm_moe_dense_by_default", "dynjax/models/llm.py",
           'moe_dispatch: str = "dropless"', 'moe_dispatch: str = "dense"',
           ("tests/test_hf.py::test_dropless_is_the_default_and_has_no_tokens_by_experts_intermediate",),
           "the HF MoE ports run dropless by default: no [tokens, E, d_ff] intermediate"),
    Mutant("dropless_loop_skips_each_experts_last_block", "dynjax/models/dispatch.py",
           "fori_loop(whole * CHUNK, count,", "fori_loop(whole * CHUNK, count - 1,",
           ("tests/test_dispatch.py::test_dropless_equals_every_expert_on_every_token",),
           "the CPU grouped matmul computes every block of every expert (the remainder too)"),
    Mutant("ep_experts_assigned_round_robin", "dynjax/models/dispatch.py",
           "owner = jnp.where(live, flat // El, S)", "owner = jnp.where(live, flat % S, S)",
           ("tests/test_multidevice.py::test_data_parallel_step_matches_single_device",),
           "expert parallelism sends each pair to the device that holds its expert's weights"),
    Mutant("ep_pairs_sent_to_the_mirror_device", "dynjax/models/dispatch.py",
           "ids = jnp.where(owner[None] == jnp.arange(S)[:, None],",
           "ids = jnp.where(owner[None] == S - 1 - jnp.arange(S)[:, None],",
           ("tests/test_multihost.py::test_expert_parallel_on_two_processes_equals_one_device",),
           "on 2 processes, the all-to-all sends each pair to the process and device that hold "
           "its expert (the mirror device 3 - s is on the other process)"),
    # Checkpoint targets and routing conditions (dynjax/runs, the routing audit of HF MoEs)
    Mutant("token_identity_keeps_own_scores", "dynjax/audit/interventions.py",
           "return jnp.zeros(n, order.dtype).at[order].set(order[succ])",
           "return jnp.zeros(n, order.dtype).at[order].set(order)",
           ("tests/test_routing_conditions.py",),
           "token-identity gives a position the scores of another occurrence of its id"),
    Mutant("token_identity_ignores_the_id", "dynjax/audit/interventions.py",
           "return jnp.zeros(n, order.dtype).at[order].set(order[succ])",
           "return jnp.zeros(n, order.dtype).at[order].set(order[nxt])",
           ("tests/test_routing_conditions.py",),
           "token-identity's donor holds the same token id"),
    Mutant("expert_relabel_identity", "dynjax/audit/interventions.py",
           "perms = jax.vmap(lambda kl: derangement(kl, n_exp))",
           "perms = jax.vmap(lambda kl: jnp.arange(n_exp))",
           ("tests/test_routing_conditions.py",), "expert relabel moves every expert's scores"),
    Mutant("expert_relabel_one_permutation_for_all_layers", "dynjax/audit/interventions.py",
           "(jax.random.split(k, a.shape[layer]))", "(jnp.stack([k] * a.shape[layer]))",
           ("tests/test_routing_conditions.py",), "expert relabel draws a permutation per layer"),
    Mutant("weights_flat_keeps_the_weights", "dynjax/audit/interventions.py",
           "jnp.where(chosen, mean, low)", "jnp.where(chosen, b, low)",
           ("tests/test_routing_conditions.py",),
           "weights-flat gives the chosen experts equal weights"),
    Mutant("weights_flat_changes_the_set", "dynjax/audit/interventions.py",
           "low = jnp.where(mean > 0, 0.0, mean - 1.0)", "low = mean + 1.0",
           ("tests/test_routing_conditions.py",), "weights-flat keeps each token's top-k experts"),
    Mutant("routing_conditions_on_any_schema", "dynjax/audit/settings.py",
           "elif cond.axes and not any(all(a in ax for a in cond.axes) for ax in leaves):",
           "elif False:", ("tests/test_routing_conditions.py",),
           "a condition on experts is not applicable to coefficients without an expert axis"),
    Mutant("hf_target_forgets_top_k", "dynjax/runs/hf.py",
           'return {"top_k": int(self.cfg.top_k)} if self.cfg.moe_layers else {}',
           'return {"top_k": 1} if self.cfg.moe_layers else {}',
           ("tests/test_audit_hf.py::test_open_target_tells_hf_directories_apart",),
           "weights-flat keeps the checkpoint's own top-k"),
    Mutant("tokens_per_expert_not_per_layer", "dynjax/measure/panels.py",
           "return counts / counts.sum(axis=1, keepdims=True)", "return counts / counts.sum()",
           ("tests/test_audit_hf.py::test_scorecard_hf_tokens_per_expert_and_parameters",),
           "the scorecard's tokens per expert are each layer's shares of its routes"),
    Mutant("old_classifier_runs_not_recognised", "dynjax/runs/rundir.py",
           'return family == CLASSIFIER_FAMILY if family else "dataset" in config.data',
           "return family == CLASSIFIER_FAMILY",
           ("tests/test_audit_families.py::test_open_target_opens_every_kind",),
           "a classifier run written before the family was recorded still opens"),
    Mutant("resume_rewrites_old_config", "dynjax/runs/rundir.py",
           'if old.exists() and "family" not in json.loads(old.read_text()).get("model", {}):',
           "if False:", ("tests/test_audit_families.py::test_open_target_opens_every_kind",),
           "resuming an old classifier run keeps its config.json's form"),
    # the loop compiles a family's XLA options in the guard's jit, not nested (session 35)
    Mutant("family_options_nested_in_the_guard", "dynjax/train/loop.py",
           "task.train_step(top_level=False)", "task.train_step()",
           ("tests/test_train.py::test_a_family_with_its_own_xla_options_trains_through_the_loop",),
           "a family with its own XLA options (MUDD) trains through train.py's loop"),
    # logging (issue 33)
    Mutant("sample_ignores_eos", "dynjax/programs/sample.py",
           "            if int(tok[0]) in text.stop:", "            if False:",
           ("tests/test_sampling.py::test_sample_py_decodes_an_hf_checkpoint_through_its_tokenizer",),
           "text sampled from an HF checkpoint stops at its eos_token_id"),
    Mutant("sample_decodes_tokens_without_context", "dynjax/decoding/text.py",
           "            start = max(read[0] - self.CONTEXT, 0)\n", "            start = read[0]\n",
           ("tests/test_sampling.py::test_sample_py_decodes_an_hf_checkpoint_through_its_tokenizer",),
           "an HF checkpoint's text is decoded with the tokens before it (leading spaces, merges)"),
    Mutant("tensorboard_drops_a_metric", "dynjax/train/tensorboard.py",
           "        for tag, value in scalars(record):\n            self._event(",
           "        for tag, value in scalars(record)[:-1]:\n            self._event(",
           ("tests/test_tensorboard.py::test_run_directory_files_on_gs_through_epath",),
           "every numeric field of every metrics.jsonl record is a TensorBoard event"),
    Mutant("tensorboard_resume_keeps_stale_events", "dynjax/train/tensorboard.py",
           "                if want[(v.tag, ev.step)] > 0:", "                if True:",
           ("tests/test_tensorboard.py::test_run_directory_files_on_gs_through_epath",),
           "a resumed run's event files hold no step twice (no event past the checkpoint)"),
    # reliability (issue 31): dynjax/train/{guard,loop,checkpoint,preempt,runlock,metrics,
    # optim}.py, tests/test_faults.py (docs/reliability.md lists the promises)
    Mutant("nonfinite_step_not_stopped", "dynjax/train/loop.py",
           "    if bad >= 0 and not skip:\n", "    if False:\n",
           (FAULTS + "test_divergence_stops_naming_the_step_and_the_newest_finite_checkpoint",),
           "a non-finite step stops the run, naming the step and the newest finite checkpoint"),
    Mutant("guard_not_read_before_a_save", "dynjax/train/loop.py",
           "        if logged or saving:   # the guard", "        if logged:   # the guard",
           (FAULTS + "test_divergence_stops_naming_the_step_and_the_newest_finite_checkpoint",),
           "the guard is read before every checkpoint save, not only at logged steps"),
    Mutant("skip_nonfinite_applies_the_update", "dynjax/train/guard.py",
           "lambda n, o: jnp.where(finite, n, o), keep, old)", "lambda n, o: n, keep, old)",
           (FAULTS + "test_skip_nonfinite_skips_and_counts",),
           "skip_nonfinite keeps the previous parameters and optimizer state"),
    Mutant("nonfinite_state_saved", "dynjax/train/checkpoint.py",
           "    sums, bad = integrity.digest(state)\n    if bad:\n",
           "    sums, bad = integrity.digest(state)\n    if False:\n",
           (FAULTS + "test_a_non_finite_state_is_never_saved",),
           "a non-finite state is never written as a checkpoint"),
    Mutant("keep_n_deletes_the_newest_finite", "dynjax/train/checkpoint.py",
           "    sums, bad = integrity.digest(state)\n    if bad:\n",
           "    sums, bad = integrity.digest(state)\n    if bad:\n"
           "        mngr.save(step, args=ocp.args.StandardSave(state), force=True)\n    if bad:\n",
           (FAULTS + "test_a_non_finite_state_is_never_saved",),
           "keep-N never deletes the newest finite checkpoint to make room for a non-finite one"
           " (the refusal comes before orbax's save)"),
    Mutant("digests_not_checked_on_restore", "dynjax/train/checkpoint.py",
           "    why = integrity.check(pathlib.Path(mngr.directory) / str(step), state)\n",
           "    why = None\n",
           (FAULTS + "test_a_flipped_bit_is_caught_set_aside_and_retrained",),
           "a checkpoint whose arrays no longer match their digests is set aside on resume"),
    Mutant("signal_does_not_save", "dynjax/train/loop.py",
           "force=done == tc.steps or stopping)", "force=done == tc.steps)",
           (FAULTS + "test_a_signal_after_the_save_was_decided_stops_at_the_next_step_saved",),
           "SIGTERM/SIGINT save a checkpoint of the step the run stops at"),
    Mutant("signal_flag_read_twice", "dynjax/train/loop.py",
           "        if stopping:\n            break\n",
           "        if stop.signum is not None:\n            break\n",
           (FAULTS + "test_a_signal_after_the_save_was_decided_stops_at_the_next_step_saved",),
           "a run stops only at a step it saved (the preemption race)"),
    Mutant("second_signal_waits_for_the_main_thread", "dynjax/train/preempt.py",
           "                    if seen == 1:\n", "                    if seen >= 1:\n",
           (FAULTS + "test_a_second_signal_exits_at_once_while_the_main_thread_computes",),
           "a second signal exits at once, even while the main thread is in a computation"),
    Mutant("run_lock_shared", "dynjax/train/runlock.py",
           "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)",
           "fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)",
           (FAULTS + "test_a_second_writer_is_refused_naming_the_holder",),
           "a second train.py on a run directory is refused, naming the holder"),
    Mutant("lease_never_renewed", "dynjax/train/runlock.py",
           "                return                          # taken over after a stall: stop claiming\n            self._write()",
           "                return                          # taken over after a stall: stop claiming\n            pass",
           (FAULTS + "test_a_gs_run_directory_is_locked_by_a_heartbeat_lease",),
           "a gs:// run's lease is renewed by its heartbeat while it trains"),
    Mutant("lapsed_lease_kept", "dynjax/train/runlock.py",
           "        if age < self.lease:", "        if age < 1e9:",
           (FAULTS + "test_a_gs_run_directory_is_locked_by_a_heartbeat_lease",),
           "a gs:// lock whose heartbeat lapsed (its writer died) is taken over"),
    Mutant("lease_not_released", "dynjax/train/runlock.py",
           "            self.path.unlink(missing_ok=True)", "            pass",
           (FAULTS + "test_a_gs_run_directory_is_locked_by_a_heartbeat_lease",),
           "a gs:// run's lock goes when its writer finishes"),
    Mutant("changed_train_fields_accepted", "dynjax/train/checkpoint.py",
           'if changes and not new_t.get("allow_changes", False):', "if False:",
           ("tests/test_train.py::test_resume_equals_uninterrupted",),
           "a changed train.* field on resume is refused unless train.allow_changes"),
    Mutant("torn_metrics_line_blocks_resume", "dynjax/train/metrics.py",
           "            if i == len(lines) - 1:", "            if False:",
           (FAULTS + "test_a_flipped_bit_is_caught_set_aside_and_retrained",),
           "a torn last line of metrics.jsonl is dropped with a warning on resume"),
    Mutant("adam_b2_not_validated", "dynjax/train/optim.py",
           'for name in ("b1", "b2"):', 'for name in ("b1",):',
           (FAULTS + "test_optimizer_nonsense_is_refused",),
           "optimizer fields are validated (0 <= b1, b2 < 1)"),
    Mutant("finished_run_trained_again", "dynjax/train/loop.py",
           'return result if result is not None and result.get("step") == steps else None',
           "return None",
           (FAULTS + "test_a_finished_run_rerun_is_a_no_op_and_a_stale_lock_is_taken_over",),
           "a finished run started again is a no-op: no duplicated records"),
    Mutant("workdir_not_checked_before_compute", "dynjax/train/loop.py",
           '        check_writable(run_dir, "--workdir")\n', "        pass\n",
           (FAULTS + "test_an_unwritable_workdir_is_refused_before_any_compute",),
           "an unwritable --workdir is refused before any compute"),
    Mutant("full_disk_not_mapped", "dynjax/train/checkpoint.py",
           "    if code is None:\n        return e\n", "    return e\n",
           (FAULTS + "test_a_full_disk_is_one_line_and_loses_nothing",),
           "orbax's out-of-space error is one OSError line (path, errno)"),
    Mutant("audit_blames_replay_for_nan", "dynjax/audit/per_checkpoint.py",
           "        if nonfinite:\n", "        if False:\n",
           ("tests/test_audit_run.py::test_non_finite_parameters_are_named_not_blamed_on_replay",),
           "the audit checks the parameters are finite before blaming replay"),
    # --- the FCA sweep's report (issue 30) ---
    Mutant("size_slope_ignores_the_small_points_error", "experiments/size_slope.py",
           'se = math.hypot(a["se_log"], b["se_log"]) / dx', 'se = b["se_log"] / dx',
           ("tests/test_size_slope.py",),
           "the size slope's uncertainty combines both points' errors"),
    # --- docs/performance.md's tables are results/vs_pytorch.json (issue 32) ---
    Mutant("performance_tables_show_the_loop_as_the_isolated_step", "benchmarks/vs_pytorch_tables.py",
           "f\" ({r['dynjax'][name + '_s']:.3f} s vs", "f\" ({r['dynjax_loop'][name + '_s']:.3f} s vs",
           ("tests/test_docs.py::test_performance_tables_are_the_results_file",),
           "the performance page's tables are the results file's figures"),
    Mutant("sweep_report_drops_what_it_did_not_write", "experiments/fca_sweep.py",
           "            if not (tmp / entry.name).exists():", "            if False:",
           ("tests/test_fca_sweep.py::test_report_carries_forward_rows_whose_runs_are_gone",),
           "a report keeps results/fca_sweep/'s README and committed seed archives"),
    Mutant("performance_page_write_keeps_old_rows", "benchmarks/vs_pytorch_tables.py",
           "        lines[start:end] = table(res)", "        lines[start:start + 2] = table(res)[:2]",
           ("tests/test_docs.py::test_write_puts_each_table_back_in_its_place",),
           "--write replaces each table on the performance page whole"),
    # --- a model's init is one compiled program (issue 32: the suite's compile time) ---
    Mutant("init_program_changes_the_values", "dynjax/models/__init__.py",
           'return nn.meta.unbox(self.module.init(key, tokens)["params"])',
           'return nn.meta.unbox(self.module.init(jax.random.fold_in(key, 1), tokens)["params"])',
           ("tests/test_registry.py::test_init_is_one_program_with_the_op_by_op_values",),
           "a model's compiled init gives the op-by-op module's parameters, bit for bit"),
    Mutant("init_compiled_on_every_call", "dynjax/models/__init__.py",
           "    @functools.cached_property\n    def _init(self):\n        def init_params(key, tokens):",
           "    @property\n    def _init(self):\n        def init_params(key, tokens):",
           ("tests/test_registry.py::test_init_is_one_program_with_the_op_by_op_values",),
           "a model's init compiles once per input shape, not once per call"),
    # --- Gated DeltaNet (issue 46): dynjax/models/deltanet.py ---
    Mutant("deltanet_decay_sign", "dynjax/models/deltanet.py",
           'g = -jnp.exp(p["A_log"].astype(F32))', 'g = jnp.exp(p["A_log"].astype(F32))',
           ("tests/test_deltanet.py::test_layer_equals_transformers",),
           "DeltaNet's log decay is -exp(A_log) softplus(a + dt_bias), never positive"),
    Mutant("deltanet_chunk_boundary_dropped", "dynjax/models/deltanet.py",
           'o = jnp.einsum("bhik,bhkv->bhiv", q_c, S) + jnp.einsum(',
           'o = 0 * jnp.einsum("bhik,bhkv->bhiv", q_c, S) + jnp.einsum(',
           ("tests/test_deltanet.py::test_chunked_equals_recurrence",),
           "the chunked delta rule reads the state carried across chunk boundaries"),
    Mutant("deltanet_conv_state_off_by_one", "dynjax/models/deltanet.py",
           "return y, xs[:, xs.shape[1] - (K - 1):]", "return y, xs[:, xs.shape[1] - K:-1]",
           ("tests/test_deltanet.py::test_decoding_equals_forward",),
           "the conv state a decoding step continues from is the last K-1 inputs"),
    Mutant("deltanet_z_gate_not_applied", "dynjax/models/deltanet.py",
           "return (y * jax.nn.silu(z.astype(F32))).astype(x.dtype)", "return y.astype(x.dtype)",
           ("tests/test_deltanet.py::test_layer_equals_transformers",),
           "DeltaNet's output norm is gated by SiLU(z)"),
    Mutant("deltanet_fused_b_a_swapped", "dynjax/models/deltanet.py",
           '"b": ba[..., :r].reshape(D, Hv), "a": ba[..., r:].reshape(D, Hv)',
           '"b": ba[..., r:].reshape(D, Hv), "a": ba[..., :r].reshape(D, Hv)',
           ("tests/test_deltanet.py::test_layer_equals_transformers",),
           "Qwen3-Next's fused in_proj_ba is split [b, a] per key head"),
    Mutant("deltanet_coefficient_site_bypassed", "dynjax/models/deltanet.py",
           "used = coeffs_lib.site(decay_and_beta(p, x), given)", "used = decay_and_beta(p, x)",
           ("tests/test_deltanet.py::test_coefficients_record_and_replay_bitwise_in_one_program",),
           "replayed DeltaNet beta and decay are the ones the layer uses"),
    Mutant("hub_ignores_refs_main", "dynjax/loaders/hub.py",
           "commit = ref.read_text().strip() if ref.is_file() else revision",
           "commit = sorted(p.name for p in (folder / 'snapshots').iterdir())[0]",
           ("tests/test_hub.py::test_repo_id_resolves_to_the_snapshot_refs_main_names",),
           "a repo id resolves to the snapshot refs/main (or the revision) names"),
    Mutant("hub_skips_the_environment", "dynjax/loaders/hub.py",
           'home = os.environ.get("HF_HOME") or', 'home = None or',
           ("tests/test_hub.py::test_the_cache_folder_follows_hf_home_and_xdg",),
           "the cache folder is $HF_HUB_CACHE, else $HF_HOME/hub, else XDG's"),
    Mutant("program_help_imports_jax", "dynjax/programs/train.py",
           "from dynjax import errors, programs\n",
           "from dynjax import errors, programs\nfrom dynjax.train import loop  # noqa\n",
           ("tests/test_programs.py::test_program_modules_import_no_jax",),
           "a program's --help loads neither JAX nor its library"),
    Mutant("configs_offer_helpers", "dynjax/configs/__init__.py",
           'if not p.stem.startswith("_") and "\\ndef get_config(" in p.read_text())',
           'if not p.stem.startswith("_"))',
           ("tests/test_programs.py::test_configs_offered_are_configs",),
           "the configs offered are configs, not helper modules"),
    Mutant("checkout_config_path_not_explained", "dynjax/configs/__init__.py",
           "            _checkout_path(prog, value)\n", "            pass\n",
           ("tests/test_programs.py::test_a_checkout_config_path_outside_a_checkout_names_the_installed_form",),
           "configs/NAME.py outside a checkout is one line naming dynjax:NAME"),
    Mutant("no_fetch_on_demand", "dynjax/data/fetch.py",
           'if not ON_DEMAND or os.environ.get("DYNJAX_FETCH", "1") == "0":',
           "if True:",
           ("tests/test_fetch.py::test_a_program_fetches_a_missing_group_on_first_use",),
           "a program fetches a missing data group on first use"),
    # --- DeepSeek-V4 (issue 47): dynjax/models/components/hyper.py ---
    Mutant("mhc_sinkhorn_iters_off_by_one", "dynjax/models/components/hyper.py",
           "return jax.lax.fori_loop(0, iters - 1, one, m)",
           "return jax.lax.fori_loop(0, iters, one, m)",
           ("tests/test_deepseek_v4.py::test_hyper_connection_equals_transformers",),
           "mHC's comb is Sinkhorn with hc_sinkhorn_iters iterations (columns first)"),
    Mutant("mhc_comb_not_doubly_stochastic", "dynjax/models/components/hyper.py",
           '"comb": sinkhorn(comb, dims.sinkhorn_iters, dims.eps)}', '"comb": comb}',
           ("tests/test_deepseek_v4.py::test_comb_is_doubly_stochastic",),
           "mHC's comb is projected onto doubly stochastic matrices"),
    Mutant("mhc_comb_transposed", "dynjax/models/components/hyper.py",
           'jnp.einsum("btjk,btjd->btkd", comb.astype(dt), h)',
           'jnp.einsum("btkj,btjd->btkd", comb.astype(dt), h)',
           ("tests/test_deepseek_v4.py::test_hyper_connection_equals_transformers",),
           "stream k receives sum_j comb[j, k] h[j] (comb read transposed)"),
    Mutant("mhc_site_bypassed", "dynjax/models/components/hyper.py",
           "used = coeffs_lib.site(weights(dims, p, h), given)", "used = weights(dims, p, h)",
           ("tests/test_deepseek_v4.py::test_sites_record_and_replay_bitwise",),
           "replayed mHC pre/post/comb are the ones the layer uses"),
    # --- figures a paper takes as they are, results without machine paths (issue 49) ---
    Mutant("delta_nll_axis_left_to_autoscale", "dynjax/audit/report.py",   # the old order
           '    dnll_axis(ax, "x", f"ΔNLL vs Correct (nats, {level:.0%} CI)\\nunit of inference: "\n'
           '                       f"{results[\'unit\']}")\n'
           '    style.dot_ci(ax, [r.get("label") or _label(n) for n, r in rows], est, lo, hi)\n'
           '    style.fit(ax, "x", [est, lo, hi], include=[0.0])\n',
           '    style.dot_ci(ax, [r.get("label") or _label(n) for n, r in rows], est, lo, hi)\n'
           '    dnll_axis(ax, "x", f"ΔNLL vs Correct (nats, {level:.0%} CI)\\nunit of inference: "\n'
           '                       f"{results[\'unit\']}")\n',
           ("tests/test_figures.py::test_every_figure_holds_its_data_and_reads[main/delta_nll.png]",),
           "every ΔNLL whisker lies inside the axes (symlog autoscale clipped GlobalMean's)"),
    Mutant("audit_writes_the_absolute_run_dir", "dynjax/audit/report.py",
           "        clean = portable(to_jsonable(results))", "        clean = to_jsonable(results)",
           ("tests/test_results_files.py::test_an_audit_report_names_its_run_without_a_machine_path",),
           "an audit's results.json and report.md name runs without this machine's paths"),
    Mutant("execution_rounds_inverted", "dynjax/measure/latency.py",
           "return [a / b for a, b in zip(", "return [b / a for a, b in zip(",
           ("tests/test_scorecard.py::test_structured_panel_counts_open_blocks_and_both_programs",),
           "the execution panel records each timing round's model/baseline ratio"),
)

def copy_tree(dest: pathlib.Path) -> None:
    """The repo's tracked and untracked-but-not-ignored files (working-tree contents), and
    tests' data, into ``dest``."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, out.decode().split("\0")):
        src = ROOT / rel
        if src.is_symlink():   # e.g. configs -> dynjax/configs: a link stays a link
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).symlink_to(os.readlink(src))
        elif src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def run_tests(tree: pathlib.Path, tests, timeout: float) -> tuple[bool, str, float]:
    """(passed, first failing test or reason, seconds) for ``tests`` run in ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DYNJAX_DATA=os.environ.get("DYNJAX_DATA", str(ROOT / ".data")))
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout:.0f} s", time.monotonic() - t0
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", r.stdout, re.M)
    return r.returncode == 0, (failed[0] if failed else r.stdout.strip()[-300:]), \
        time.monotonic() - t0


def apply(tree: pathlib.Path, m: Mutant) -> str | None:
    """Write the mutant into ``tree``; the original text, or None if ``old`` is stale."""
    path = tree / m.path
    text = path.read_text()
    if text.count(m.old) != 1:
        return None
    path.write_text(text.replace(m.old, m.new))
    return text


def main(argv=None):
    from dynjax.jsonio import command_line, publish_json

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="comma-separated parts of mutant names")
    p.add_argument("--list", action="store_true", help="list the mutants and exit")
    p.add_argument("--timeout", type=float, default=900, help="seconds per pytest call")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    parts = [s for s in args.only.split(",") if s]
    chosen = [m for m in MUTANTS if not parts or any(s in m.name for s in parts)]
    if not chosen:
        p.error(f"--only={args.only}: no mutant matches; --list shows their names")
    if args.list:
        for m in chosen:
            print(f"{m.name:40s} {m.path}  ->  {' '.join(m.tests)}\n{'':40s} breaks: {m.breaks}")
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="dynjax-mutants-") as tmp:
        tree = pathlib.Path(tmp)
        copy_tree(tree)
        files = sorted({t.split("::")[0] for m in chosen for t in m.tests})
        ok, why, secs = run_tests(tree, files, args.timeout * len(files))
        if not ok:
            raise SystemExit(f"mutation_check.py: the unmutated tests fail ({why}); fix them "
                             "first, a survivor means nothing otherwise")
        print(f"baseline: {len(files)} test files pass ({secs:.0f} s)", file=sys.stderr)
        for m in chosen:
            original = apply(tree, m)
            if original is None:
                results.append(dict(name=m.name, path=m.path, status="stale", tests=m.tests,
                                    breaks=m.breaks))
                print(f"{m.name}: stale (its text is not in {m.path} exactly once)",
                      file=sys.stderr)
                continue
            try:
                passed, why, secs = run_tests(tree, m.tests, args.timeout)
            finally:
                (tree / m.path).write_text(original)
            status = "survived" if passed else "killed"
            results.append(dict(name=m.name, path=m.path, status=status, tests=m.tests,
                                breaks=m.breaks, caught_by=None if passed else why,
                                seconds=round(secs, 1)))
            print(f"{m.name}: {status}{'' if passed else ' by ' + why} ({secs:.0f} s)",
                  file=sys.stderr)
    counts = {s: sum(r["status"] == s for r in results) for s in ("killed", "survived", "stale")}
    publish_json({"command": command_line(), "counts": counts, "mutants": results}, args.out)
    return 1 if counts["survived"] or counts["stale"] else 0


if __name__ == "__main__":
    sys.exit(main())
