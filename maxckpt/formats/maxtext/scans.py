"""How MaxText stacks a family's layers: one object per scan style (`Family.maxtext_scan`, :data:`SCANS`).

Each style says which MaxText stacks hold which HF layers (:meth:`Scan.stacks`: :class:`Stack`s of one
param table each) and what a checkpoint's tree tells of the model (:meth:`Scan.infer_dims`):

- "layers": one `decoder/layers` stack (unscanned: `decoder/layers_{i}`);
- "pairs": gemma2's (local, global) pairs in one MaxText layer;
- "blocks": gemma3's and gpt-oss's blocks of n layers, `decoder/layers/layers_{j}`, the rest unstacked
  in `decoder/layers_remainder/layers_{r}`;
- "dense_moe": DeepSeek's `dense_layers` and `moe_layers`;
- "hybrid": the Gated DeltaNet hybrids (qwen3-next's local/global blocks, qwen3.5's per-position layers);
- "cycle": llama4's `decoder/layers/layers_{j}`, one per position of the layer cycle;
- "local_global": gemma4's `scanned_blocks` (:mod:`maxckpt.formats.maxtext.local_global`).

Scanned tensors stack layers on `param_scan_axis` (1 in MaxText, for every layer tensor, experts
included: `[X, L, ...]`; DeepSeek's routing bias in `nnx_aux` is `[L, X]`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

from maxckpt.errors import CorruptCheckpointError, ShapeMismatchError, UnsupportedModelError
from maxckpt.families import FAMILIES, Family
from maxckpt.formats.hf import layout as hfl
from maxckpt.formats.maxtext import local_global
from maxckpt.formats.maxtext.params import AUX_PREFIX, ModelVariable, layer_params, local_global_layer_params
from maxckpt.layouts import geometry
from maxckpt.layouts import transforms as tf
from maxckpt.layouts.base import ModelSpec
from maxckpt.layouts.mapping import Entry
from maxckpt.tensors import TensorInfo

__all__ = ["SCANS", "Scan", "Stack", "layer_stacks", "scan_of"]

_LAYER_RE = re.compile(r"^decoder/layers_(\d+)/(.+)$")

LayerCount = Callable[[str], int]  # a stack prefix -> how many layers it holds


@dataclass(frozen=True)
class Stack:
    """A group of MaxText layers with one param table, and the HF layers they are.

    Scanned (`indices` None): each param is one tensor `{prefix}/{param}` with
    the layers stacked on the scan axis, position k being HF layer `hf_layers[k]`.
    Unscanned: `prefix` holds `{i}`, and HF layer `hf_layers[k]` is
    `{prefix.format(i=indices[k])}/{param}`.
    """

    params: tuple[Entry, ...]
    hf_layers: tuple[int, ...]
    prefix: str
    indices: tuple[int, ...] | None = None
    # Scanned on two axes (a hybrid's local_layers): [scan axis] the block, [scan axis + 1] the position in it,
    # `inner` positions per block; hf_layers are block-major. 0: one layer axis.
    inner: int = 0
    # The spec sizing this stack's tensors when it differs from the model's (gemma4's full-attention layers).
    spec: ModelSpec | None = None

    def sized(self, spec: ModelSpec) -> ModelSpec:
        """The spec this stack's params are shaped and transformed by."""
        return self.spec or spec

    def stacked_shape(self, shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
        """The stored shape of a scanned param whose one-layer shape is `shape`, layers stacked at `axis`."""
        if not self.inner:
            return tf.insert_axis(shape, axis, len(self.hf_layers))
        return tf.insert_axis(tf.insert_axis(shape, axis, len(self.hf_layers) // self.inner), axis + 1, self.inner)

    @property
    def scanned(self) -> bool:
        return self.indices is None

    def path(self, p: Entry, k: int | None = None) -> str:
        """Canonical MaxText path of entry `p` (position k's, when unscanned)."""
        prefix = self.prefix if k is None or self.indices is None else self.prefix.format(i=self.indices[k])
        return f"{AUX_PREFIX if isinstance(p, ModelVariable) else ''}{prefix}/{p.key}"

def scan_of(family: str | None) -> "Scan":
    """The scan style of a family (a tree whose family is unknown reads as plain "layers")."""
    return SCANS[FAMILIES[family].maxtext_scan if family else "layers"]


def layer_stacks(spec: ModelSpec, scanned: bool) -> list[Stack]:
    """How MaxText lays out this family's layers (Family.maxtext_scan), scanned or not."""
    return SCANS[FAMILIES[spec.family].maxtext_scan].stacks(spec, scanned)


class Scan:
    """A scan style. The styles of one layer table ("layers", "pairs", "blocks", "dense_moe") read dims from
    the first stack that has a param (:meth:`infer_dims`), each naming its stacks in :meth:`layer_probes`."""

    name: ClassVar[str]
    suffix: ClassVar[str] = ""  # the local half's module suffix in a MaxText layer ("pairs": "_local")

    def stacks(self, spec: ModelSpec, scanned: bool) -> list[Stack]:
        raise NotImplementedError

    def owns(self, family: Family, text: str) -> bool:
        """Whether a tree's module names (one per line) name `family` by its scan style alone."""
        return False

    def layer_probes(self, names: Mapping[str, str], scanned: bool, layer_count: LayerCount
                     ) -> tuple[int, list[tuple[str, int]]]:
        """(number of layers, [(stack prefix, its layers)]) of a tree."""
        num_layers = layer_count("decoder/layers")
        return num_layers, [("decoder/layers", num_layers)]

    def first_dense_layers(self, probes: list[tuple[str, int]]) -> int:
        return 0

    def infer_dims(self, names: Mapping[str, str], infos: Mapping[str, TensorInfo], scanned: bool, axis: int,
                   family: str | None) -> dict[str, Any]:
        """The ModelSpec fields the tree shows: layers, widths, heads, MLA, biases, experts."""
        def layer_count(prefix: str) -> int:
            """Layers under `prefix` (stacked: its scan axis; unstacked: how many `prefix_{i}` there are)."""
            if scanned:
                sizes = {
                    infos[s].shape[axis]
                    for c, s in names.items()
                    if c.startswith(prefix + "/")
                    and len(infos[s].shape) > axis
                    and not c.startswith(AUX_PREFIX)
                }
                return max(sizes) if sizes else 0
            pattern = re.compile(rf"^{re.escape(prefix)}_(\d+)/")
            found = {int(m.group(1)) for n in names if (m := pattern.match(n))}
            return max(found) + 1 if found else 0

        num_layers, probes = self.layer_probes(names, scanned, layer_count)
        if not num_layers:
            raise CorruptCheckpointError("MaxText checkpoint has neither decoder/layers nor decoder/layers_0")

        def probe_shape(path: str) -> tuple[int, ...] | None:
            """One layer's shape of a param, from the first stack that has it; None when absent."""
            for prefix, count in probes:
                if not count:
                    continue
                stacked = scanned and not prefix.startswith("decoder/layers_remainder")
                full = f"{prefix}/{path}" if stacked or prefix.endswith("_0") else f"{prefix}_0/{path}"
                if full in names:
                    shape = tuple(infos[names[full]].shape)
                    return tf.remove_axis(shape, axis) if stacked else shape
            return None

        def shape(path: str) -> tuple[int, ...]:
            found = probe_shape(path)
            if found is None:
                raise UnsupportedModelError(
                    f"MaxText checkpoint has no layer param {path}: not a parameter tree of a family maxckpt "
                    f"converts ({', '.join(FAMILIES)})"
                )
            return found

        vocab, emb = infos[names["token_embedder/embedding"]].shape
        suffix = self.suffix
        attn = (FAMILIES[family].maxtext_attention if family else "self_attention") + suffix
        dims: dict[str, Any] = {
            "num_layers": num_layers,
            "emb_dim": emb,
            "vocab_size": vocab,
            "tie_word_embeddings": "decoder/logits_dense/kernel" not in names,
        }
        if family:
            dims["_family"] = family
        if probe_shape(f"{attn}/wkv_a/kernel") is not None:  # MLA (a query LoRA, or one query kernel: deepseek2)
            lora = probe_shape(f"{attn}/wq_a/kernel") is not None
            q_lora = shape(f"{attn}/wq_a/kernel")[-1] if lora else 0
            kv_lora = shape(f"{attn}/kv_norm/scale")[0]
            _, heads, qk = shape(f"{attn}/wq_b/kernel" if lora else f"{attn}/query/kernel")
            kv_a = shape(f"{attn}/wkv_a/kernel")[-1]
            _, _, kvb = shape(f"{attn}/wkv_b/kernel")
            v_dim = shape(f"{attn}/out/kernel")[1]
            rope = kv_a - kv_lora
            dims.update(q_lora_rank=q_lora, kv_lora_rank=kv_lora, qk_rope_head_dim=rope, qk_nope_head_dim=qk - rope,
                        v_head_dim=v_dim, num_heads=heads, num_kv_heads=heads, head_dim=rope, qk_norm=False)
            index_weights = probe_shape(f"{attn}/indexer/weights_proj/kernel")
            if index_weights is not None:  # DeepSeek-V3.2's indexer
                dims.update(indexer_n_heads=index_weights[-1], indexer_head_dim=shape(f"{attn}/indexer/wk/kernel")[-1])
            if kvb != qk - rope + v_dim:
                raise ShapeMismatchError(f"MLA wkv_b has {kvb} features per head; q says nope {qk - rope} + v {v_dim}")
        else:
            _, heads, head_dim = shape(f"{attn}/query/kernel")
            dims.update(num_heads=heads, head_dim=head_dim, num_kv_heads=shape(f"{attn}/key/kernel")[1],
                        qk_norm=probe_shape(f"{attn}/query_norm/scale") is not None)
            if probe_shape(f"{attn}/query/bias") is not None:  # with out/bias: gpt-oss's four; without: qwen2.5's
                dims["attention_bias" if probe_shape(f"{attn}/out/bias") is not None else "qkv_bias"] = True
            if probe_shape(f"{attn}/sinks") is not None:
                dims["attention_sinks"] = True
        dense_mlp = probe_shape(f"mlp{suffix}/wi_0/kernel")
        moe = FAMILIES[family].maxtext_moe if family else None
        if moe and probe_shape(f"{moe}/wi_0") is not None:
            experts, _, width = shape(f"{moe}/wi_0")
            dims.update(num_experts=experts, moe_mlp_dim=width,
                        router_bias=probe_shape(f"{moe}/gate/bias") is not None,
                        expert_bias=probe_shape(f"{moe}/wi_0_bias") is not None)
            shared = probe_shape(moe.rsplit("/", 1)[0] + "/shared_experts/wi_0/kernel") if "/" in moe else None
            dims["num_shared_experts"] = shared[-1] // width if shared is not None else 0
            dims["first_dense_layers"] = self.first_dense_layers(probes)
        if dense_mlp is not None:
            dims["mlp_dim"] = dense_mlp[-1]
        elif "moe_mlp_dim" in dims:
            dims["mlp_dim"] = dims["moe_mlp_dim"]
        else:
            shape(f"mlp{suffix}/wi_0/kernel")  # raises: no MLP this layout knows
        return dims


def _one_table(spec: ModelSpec, scanned: bool) -> list[Stack]:
    """Every layer alike: one `decoder/layers` stack, or `decoder/layers_{i}`."""
    params = layer_params(spec, spec.num_experts > 0)
    if not scanned:
        return [Stack(params, tuple(range(spec.num_layers)), "decoder/layers_{i}", tuple(range(spec.num_layers)))]
    return [Stack(params, tuple(range(spec.num_layers)), "decoder/layers")]


class Layers(Scan):
    name = "layers"

    def stacks(self, spec: ModelSpec, scanned: bool) -> list[Stack]:
        return _one_table(spec, scanned)


class Pairs(Scan):
    """gemma2: one MaxText layer = HF layers 2i (local) and 2i + 1 (global)."""

    name = "pairs"
    suffix = "_local"

    def stacks(self, spec: ModelSpec, scanned: bool) -> list[Stack]:
        L, moe = spec.num_layers, spec.num_experts > 0
        if L % 2:
            raise UnsupportedModelError(f"{spec.family}: {L} layers is not a whole number of (local, global) pairs")
        out = []
        for j, suffix in enumerate(("_local", "_global")):
            hf = tuple(range(j, L, 2))
            prefix, indices = ("decoder/layers", None) if scanned else ("decoder/layers_{i}", tuple(range(L // 2)))
            out.append(Stack(layer_params(spec, moe, suffix), hf, prefix, indices))
        return out

    def layer_probes(self, names: Mapping[str, str], scanned: bool, layer_count: LayerCount
                     ) -> tuple[int, list[tuple[str, int]]]:
        num_layers, probes = super().layer_probes(names, scanned, layer_count)
        return 2 * num_layers, probes


class Blocks(Scan):
    """gemma3, gpt-oss: blocks of sliding_window_pattern n layers scanned as `decoder/layers/layers_{j}`, the
    rest unstacked in `decoder/layers_remainder/layers_{r}` (where the family's MaxText writes one)."""

    name = "blocks"

    def stacks(self, spec: ModelSpec, scanned: bool) -> list[Stack]:
        if not scanned:
            return _one_table(spec, scanned)
        L, n = spec.num_layers, spec.sliding_window_pattern
        params = layer_params(spec, spec.num_experts > 0)
        blocks = L // n
        out = [
            Stack(params, tuple(b * n + j for b in range(blocks)), f"decoder/layers/layers_{j}")
            for j in range(n)
            if blocks
        ]
        rest = tuple(range(blocks * n, L))
        if rest and not FAMILIES[spec.family].maxtext_scan_remainder:
            raise UnsupportedModelError(
                f"{spec.family}: {L} layers is not a whole number of blocks of {n}; MaxText scans only whole "
                "blocks of this family (and drops the rest), so convert with scan_layers=false"
            )
        if rest:
            out.append(Stack(params, rest, "decoder/layers_remainder/layers_{i}", tuple(range(len(rest)))))
        return out

    def layer_probes(self, names: Mapping[str, str], scanned: bool, layer_count: LayerCount
                     ) -> tuple[int, list[tuple[str, int]]]:
        if not scanned:
            return super().layer_probes(names, scanned, layer_count)
        blocks = {int(m.group(1)) for n in names if (m := re.match(r"^decoder/layers/layers_(\d+)/", n))}
        rest = {int(m.group(1)) for n in names if (m := re.match(r"^decoder/layers_remainder/layers_(\d+)/", n))}
        per_block = layer_count("decoder/layers/layers_0") if blocks else 0
        probes = [("decoder/layers/layers_0", per_block)] if blocks else []
        probes.append(("decoder/layers_remainder/layers_0", len(rest)))
        return per_block * len(blocks) + len(rest), probes


class DenseMoe(Scan):
    """DeepSeek: the leading dense layers in `decoder/dense_layers`, the MoE ones in `decoder/moe_layers`."""

    name = "dense_moe"

    def stacks(self, spec: ModelSpec, scanned: bool) -> list[Stack]:
        L, k = spec.num_layers, spec.first_dense_layers
        groups = [(layer_params(spec, False), tuple(range(k)), "decoder/dense_layers"),
                  (layer_params(spec, True), tuple(range(k, L)), "decoder/moe_layers")]
        return [
            Stack(params, hf, prefix) if scanned else Stack(params, hf, prefix + "_{i}", tuple(range(len(hf))))
            for params, hf, prefix in groups if hf
        ]

    def layer_probes(self, names: Mapping[str, str], scanned: bool, layer_count: LayerCount
                     ) -> tuple[int, list[tuple[str, int]]]:
        dense, moe_layers = layer_count("decoder/dense_layers"), layer_count("decoder/moe_layers")
        return dense + moe_layers, [("decoder/dense_layers", dense), ("decoder/moe_layers", moe_layers)]

    def first_dense_layers(self, probes: list[tuple[str, int]]) -> int:
        return probes[0][1]


@dataclass(frozen=True)
class OwnTree(Scan):
    """A style whose tree is its own: its stacks (`build`) and its reading of dims (`read`) are functions of
    their own, and `marker` tells a tree of its family by a module name (None: by the usual markers)."""

    name: str  # type: ignore[misc]
    build: Callable[[ModelSpec, bool], list[Stack]]
    read: Callable[[Mapping[str, str], Mapping[str, TensorInfo], bool, int, Family], dict[str, Any]]
    marker: Callable[[Family, str], bool] | None = None

    def stacks(self, spec: ModelSpec, scanned: bool) -> list[Stack]:
        return self.build(spec, scanned)

    def owns(self, family: Family, text: str) -> bool:
        return self.marker is not None and self.marker(family, text)

    def infer_dims(self, names: Mapping[str, str], infos: Mapping[str, TensorInfo], scanned: bool, axis: int,
                   family: str | None) -> dict[str, Any]:
        return self.read(names, infos, scanned, axis, FAMILIES[family])




def cycle_stacks(spec: ModelSpec, scanned: bool) -> list[Stack]:
    """A "cycle" family's layers (llama4): MoE or dense MLP per layer (hfl.is_moe_layer).

    Scanned: `decoder/layers/layers_{j}` for j < layer_cycle_interval n, each stacked over the L / n blocks
    (MaxText scans whole blocks only). Unscanned: `decoder/layers_{i}`.
    """
    n, L = spec.layer_cycle_interval, spec.num_layers
    kinds = {moe: layer_params(spec, moe) for moe in (False, True)}
    if not scanned:
        stacks = []
        for moe in (False, True):
            hf = tuple(i for i in range(L) if hfl.is_moe_layer(spec, i) == moe)
            if hf:
                stacks.append(Stack(kinds[moe], hf, "decoder/layers_{i}", hf))
        return stacks
    step = max(spec.interleave_moe_layer_step or 1, 1)
    if n < 1 or L % n or n % step:
        raise UnsupportedModelError(
            f"{spec.family}: {L} layers in scanned blocks of layer_cycle_interval={n} (which must be a multiple of "
            f"interleave_moe_layer_step={step}): MaxText scans whole blocks only; convert with scan_layers=false"
        )
    return [Stack(kinds[hfl.is_moe_layer(spec, j)], tuple(b * n + j for b in range(L // n)),
                  f"decoder/layers/layers_{j}") for j in range(n)]


def hybrid_stacks(spec: ModelSpec, scanned: bool) -> list[Stack]:
    """A Gated DeltaNet hybrid's layers: blocks of full_attention_interval n layers, the last full attention.

    Scanned: `decoder/layers/local_layers` (the n - 1 Gated DeltaNet layers of every block, on two axes),
    `decoder/layers/global_layer` (one per block), leftover layers (all Gated DeltaNet) stacked in
    `decoder/layers_remainder/local_layers`. Unscanned: `decoder/layers_{i}`.
    """
    n, L, moe = spec.full_attention_interval, spec.num_layers, spec.num_experts > 0
    if n < 1:
        raise UnsupportedModelError(
            f"{spec.family} needs full_attention_interval >= 1 (--set full_attention_interval=N)"
        )
    if spec.num_shared_experts > 1:
        raise UnsupportedModelError(
            f"{spec.family}: MaxText's shared expert is one MLP of moe_mlp_dim width; this model's is "
            f"{spec.num_shared_experts} times that (HF shared_expert_intermediate_size), which MaxText cannot load"
        )
    linear, full = layer_params(spec, moe, linear=True), layer_params(spec, moe)
    if not scanned:
        lin = tuple(i for i in range(L) if i % n != n - 1)
        att = tuple(i for i in range(L) if i % n == n - 1)
        return [Stack(ps, hf, "decoder/layers_{i}", hf) for ps, hf in ((linear, lin), (full, att)) if hf]
    blocks, out = L // n, []
    if FAMILIES[spec.family].maxtext_hybrid_block == "per_layer":  # decoder/layers/layer_{j}, j < n
        if L % n:
            raise UnsupportedModelError(
                f"{spec.family}: {L} layers is not a whole number of blocks of {n}; MaxText scans only whole "
                "blocks of this family (convert with scan_layers=false)"
            )
        return [Stack(linear if j < n - 1 else full, tuple(b * n + j for b in range(blocks)),
                      f"decoder/layers/layer_{j}") for j in range(n)]
    if blocks and n > 1:
        hf = tuple(b * n + j for b in range(blocks) for j in range(n - 1))
        out.append(Stack(linear, hf, "decoder/layers/local_layers", inner=n - 1))
    if blocks:
        out.append(Stack(full, tuple(b * n + n - 1 for b in range(blocks)), "decoder/layers/global_layer"))
    rest = tuple(range(blocks * n, L))
    if rest:
        out.append(Stack(linear, rest, "decoder/layers_remainder/local_layers"))
    return out


def local_global_stacks(spec: ModelSpec, scanned: bool) -> list[Stack]:
    """gemma4's layers (formats/maxtext/local_global.py), each Stack with the spec sizing its tensors.

    Scanned: `decoder/scanned_blocks/local_layers` (the sliding layers of every block, on two axes),
    `decoder/scanned_blocks/global_layer` (one per block), leftover layers in `decoder/layers_remainder/local_layers`.
    Unscanned: `decoder/layers_{i}`.
    """
    n, L = spec.sliding_window_pattern, spec.num_layers
    if n < 1:
        raise UnsupportedModelError(f"{spec.family} needs sliding_window_pattern >= 1 (--set sliding_window_pattern=N)")
    if not scanned:
        return [Stack(local_global_layer_params(spec, i), (i,), "decoder/layers_{i}", (i,),
                      spec=geometry.layer_spec(spec, i)) for i in range(L)]
    if spec.per_layer_input_dim or spec.num_kv_shared_layers:
        raise UnsupportedModelError(
            f"{spec.family}: MaxText 0.2.5 runs a model with per-layer inputs or KV-shared layers unscanned only "
            "(its gemma4_small decoder refuses scan_layers); write it with scan_layers=false (--no-scan-layers)"
        )
    blocks, out = L // n, []
    local, full = local_global_layer_params(spec, 0), local_global_layer_params(spec, n - 1)
    if blocks and n > 1:
        hf = tuple(b * n + j for b in range(blocks) for j in range(n - 1))
        out.append(Stack(local, hf, local_global.LOCAL, inner=n - 1, spec=spec))
    if blocks:
        out.append(Stack(full, tuple(b * n + n - 1 for b in range(blocks)), local_global.GLOBAL,
                         spec=geometry.layer_spec(spec, n - 1)))
    rest = tuple(range(blocks * n, L))
    if rest:
        out.append(Stack(local, rest, local_global.REMAINDER, spec=spec))
    return out


def _hybrid_dims(names: Mapping[str, str], infos: Mapping[str, TensorInfo], scanned: bool, axis: int,
                 family: Family) -> dict[str, Any]:
    """The ModelSpec fields a Gated DeltaNet hybrid's tree shows (see :func:`hybrid_stacks`)."""
    def shape_at(path: str, stacked_axes: int) -> tuple[int, ...]:
        shape = tuple(infos[names[path]].shape)
        for _ in range(stacked_axes):
            shape = tf.remove_axis(shape, axis)
        return shape

    pre = family.maxtext_layer_norms[0]
    if scanned and family.maxtext_hybrid_block == "per_layer":  # decoder/layers/layer_{j}
        positions = sorted({int(m.group(1)) for n in names if (m := re.match(r"^decoder/layers/layer_(\d+)/", n))})
        interval = len(positions)
        blocks = infos[names[f"decoder/layers/layer_{interval - 1}/{pre}/scale"]].shape[axis]
        num_layers = blocks * interval
        one_full = lambda path: shape_at(f"decoder/layers/layer_{interval - 1}/{path}", 1)  # noqa: E731
        one_linear = lambda path: shape_at(f"decoder/layers/layer_0/{path}", 1)  # noqa: E731
    elif scanned:
        local, full = "decoder/layers/local_layers", "decoder/layers/global_layer"
        if f"{full}/{pre}/scale" not in names:
            raise UnsupportedModelError(f"{family.name} checkpoint has no {full}: no whole block of layers to read")
        blocks = infos[names[f"{full}/{pre}/scale"]].shape[axis]
        inner = infos[names[f"{local}/{pre}/scale"]].shape[axis + 1] if f"{local}/{pre}/scale" in names else 0
        rem = f"decoder/layers_remainder/local_layers/{pre}/scale"
        rest = infos[names[rem]].shape[axis] if rem in names else 0
        interval, num_layers = inner + 1, blocks * (inner + 1) + rest
        one_full = lambda path: shape_at(f"{full}/{path}", 1)  # noqa: E731
        one_linear = (lambda path: shape_at(f"{local}/{path}", 2)) if inner else (  # noqa: E731
            lambda path: shape_at(f"decoder/layers_remainder/local_layers/{path}", 1))
    else:
        layers = sorted({int(m.group(1)) for n in names if (m := _LAYER_RE.match(n))})
        attn_q = f"{family.maxtext_attention}/query/kernel"
        full_layers = [i for i in layers if f"decoder/layers_{i}/{attn_q}" in names]
        linear_layers = [i for i in layers if i not in full_layers]
        if not full_layers:
            raise UnsupportedModelError(f"{family.name} checkpoint has no full-attention layer to read heads from")
        interval, num_layers = full_layers[0] + 1, len(layers)
        one_full = lambda path: shape_at(f"decoder/layers_{full_layers[0]}/{path}", 0)  # noqa: E731
        one_linear = lambda path: shape_at(f"decoder/layers_{linear_layers[0]}/{path}", 0)  # noqa: E731
    vocab, emb = infos[names["token_embedder/embedding"]].shape
    attn, lin, moe = family.maxtext_attention, family.maxtext_linear_attention, family.maxtext_moe
    _, heads, query = one_full(f"{attn}/query/kernel")
    gated = bool(family.settings.get("attention_output_gate"))
    head_dim = query // 2 if gated else query
    dims: dict[str, Any] = {
        "_family": family.name, "_scanned": scanned, "num_layers": num_layers, "emb_dim": emb, "vocab_size": vocab,
        "tie_word_embeddings": "decoder/logits_dense/kernel" not in names, "full_attention_interval": interval,
        "num_heads": heads, "head_dim": head_dim, "num_kv_heads": one_full(f"{attn}/key/kernel")[1],
        "qk_norm": _has(one_full, f"{attn}/query_norm/scale"),
        "gdn_num_value_heads": one_linear(f"{lin}/A_log")[0],
        "gdn_value_head_dim": one_linear(f"{lin}/norm/rms_norm/scale")[0],
        "gdn_conv_kernel_dim": one_linear(f"{lin}/conv1d/kernel")[0],
    }
    if moe:
        experts, _, width = one_full(f"{moe}/wi_0")
        shared = family.maxtext_shared_experts
        has_shared = bool(shared) and _has(one_full, f"{shared}/wi_0/kernel")
        shared_width = one_full(f"{shared}/wi_0/kernel")[-1] if has_shared else 0
        dims.update(num_experts=experts, moe_mlp_dim=width, mlp_dim=width, num_shared_experts=shared_width // width,
                    router_bias=False, expert_bias=False, first_dense_layers=0)
    else:
        dims["mlp_dim"] = one_full("mlp/wi_0/kernel")[-1]
    return dims


def _cycle_dims(names: Mapping[str, str], infos: Mapping[str, TensorInfo], scanned: bool, axis: int,
                family: Family) -> dict[str, Any]:
    """The ModelSpec fields a "cycle" family's tree shows (see :func:`cycle_stacks`): the block length when
    scanned, and which layers are MoE (the first MoE layer is interleave_moe_layer_step - 1)."""
    pattern = re.compile(r"^decoder/layers/layers_(\d+)/" if scanned else r"^decoder/layers_(\d+)/")
    slots = sorted({int(m.group(1)) for n in names if (m := pattern.match(n))})
    pre = family.maxtext_layer_norms[0]
    if not slots:
        raise CorruptCheckpointError(f"{family.name} checkpoint has no decoder layers")

    def path(j: int, sub: str) -> str:
        return f"decoder/layers/layers_{j}/{sub}" if scanned else f"decoder/layers_{j}/{sub}"

    def one(j: int, sub: str) -> tuple[int, ...]:
        shape = tuple(infos[names[path(j, sub)]].shape)
        return tf.remove_axis(shape, axis) if scanned else shape

    blocks = infos[names[path(slots[0], f"{pre}/scale")]].shape[axis] if scanned else 1
    attn, moe = family.maxtext_attention, family.maxtext_moe
    moe_slots = [j for j in slots if path(j, f"{moe}/wi_0") in names]
    dense_slots = [j for j in slots if path(j, "mlp/wi_0/kernel") in names]
    vocab, emb = infos[names["token_embedder/embedding"]].shape
    _, heads, head_dim = one(slots[0], f"{attn}/query/kernel")
    dims: dict[str, Any] = {
        "_family": family.name, "num_layers": blocks * len(slots), "emb_dim": emb, "vocab_size": vocab,
        "tie_word_embeddings": "decoder/logits_dense/kernel" not in names, "num_heads": heads,
        "head_dim": head_dim, "num_kv_heads": one(slots[0], f"{attn}/key/kernel")[1],
        "qk_norm": path(slots[0], f"{attn}/query_norm/scale") in names,
    }
    if scanned:
        dims["layer_cycle_interval"] = len(slots)
    if moe_slots:
        experts, _, width = one(moe_slots[0], f"{moe}/wi_0")
        shared = moe.rsplit("/", 1)[0] + "/shared_experts/wi_0/kernel"
        dims.update(num_experts=experts, moe_mlp_dim=width, router_bias=False, expert_bias=False,
                    first_dense_layers=0, interleave_moe_layer_step=moe_slots[0] + 1,
                    num_shared_experts=one(moe_slots[0], shared)[-1] // width if path(moe_slots[0], shared) in names
                    else 0)
    dims["mlp_dim"] = one(dense_slots[0], "mlp/wi_0/kernel")[-1] if dense_slots else dims.get("moe_mlp_dim")
    return dims


def _has(one_layer, path: str) -> bool:
    try:
        one_layer(path)
    except KeyError:
        return False
    return True


# The styles whose trees are their own, each by its functions above.
HYBRID = OwnTree("hybrid", hybrid_stacks, _hybrid_dims)  # the Gated DeltaNet hybrids
CYCLE = OwnTree("cycle", cycle_stacks, _cycle_dims,  # llama4; its MoE module (Llama4MoEBlock_0) names it
                marker=lambda family, text: f"/{family.maxtext_moe.split('/')[0]}/" in text)
LOCAL_GLOBAL = OwnTree("local_global", local_global_stacks,  # gemma4
                       lambda names, infos, scanned, axis, family: local_global.infer_dims(names, infos, axis, family))
SCANS: dict[str, Scan] = {
    s.name: s for s in (Layers(), Pairs(), Blocks(), DenseMoe(), HYBRID, CYCLE, LOCAL_GLOBAL)
}
