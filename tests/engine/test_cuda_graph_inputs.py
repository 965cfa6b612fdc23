"""The CUDA-graph decoder's packed inputs expand, inside the graph, to exactly the gather lists,
masks, slots and positions that build_attention_metadata makes for the same step (runs on the
CPU: the graph and its transfer are stubbed; the expansion is the graph's own code)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from augury.engine.cuda_graphs import KV_BUCKET, CudaGraphDecoder, _Graph
from augury.layers.attention import AttentionMetadataError, SeqSpec, build_attention_metadata

BS = 4
WINDOWS = {"full": None, "sliding": 8}
TRASH = {"full": 0, "sliding": 0}


class _Stub:
    def synchronize(self):
        pass

    def record(self):
        pass

    def replay(self):
        pass


def _decoder(dtype=torch.float32) -> CudaGraphDecoder:
    d = CudaGraphDecoder.__new__(CudaGraphDecoder)
    d.blocks = SimpleNamespace(block_size=BS)
    d.windows, d.dtype, d.device = WINDOWS, dtype, torch.device("cpu")
    d.trash_block = dict(TRASH)
    d.trash = {g: b * BS for g, b in TRASH.items()}
    d.graphs, d.timing, d.max_batch = {}, None, 256

    def capture(n, Bp, kps):
        layout = d._layout(n, Bp, kps)
        size = sum(int(np.prod(s)) for _, s in layout.values())
        return _Graph(_Stub(), n, layout, torch.zeros(size, dtype=torch.long), torch.zeros(size, dtype=torch.long),
                      _Stub(), torch.zeros((n, Bp), dtype=torch.long))

    d._capture = capture
    return d


def _specs(rng: np.random.Generator, B: int, n: int, released: bool = True) -> list[SeqSpec]:
    used = iter(rng.permutation(np.arange(1, 20000)).tolist())
    specs = []
    for _ in range(B):
        nc = int(rng.integers(1, 300))
        need = (nc + n - 1) // BS + 1
        tables = {}
        for g, w in WINDOWS.items():
            t = [next(used) for _ in range(need + int(rng.integers(0, 3)))]
            if w is not None and released:
                gone = max(nc - w + 1, 0) // BS  # blocks wholly before the first new token's window
                t[:gone] = [-1] * gone
            tables[g] = t
        specs.append(SeqSpec(nc, 1, tables))
    return specs


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("B", [1, 5, 64])
def test_graph_inputs_expand_to_the_metadata(B, n):
    rng = np.random.default_rng(B * 10 + n)
    d = _decoder()
    specs = _specs(rng, B, n)
    ids = rng.integers(0, 1000, B).tolist()
    d._call(ids, specs, n)
    ((_, _, kps), e), = d.graphs.items()
    kps = dict(kps)
    assert e.n == n

    def part(name):
        off, shape = e.layout[name]
        return e.dev[off:off + int(np.prod(shape))].view(shape)

    Bp = part("ids").shape[0]
    keys = {g: torch.arange(Kp) for g, Kp in kps.items()}
    gathers, biases = d._expand(part, keys)
    wide = [SeqSpec(s.num_cached, n, s.block_tables) for s in specs]
    meta = build_attention_metadata(wide, BS, WINDOWS, "cpu")
    assert part("ids")[:B].tolist() == ids and not part("ids")[B:].any()
    assert torch.equal(part("positions")[:B], meta.positions.view(B, n)[:, 0])
    for g, gm in meta.groups.items():
        K = gm.max_kv
        Kp = keys[g].numel()
        assert Kp == -(-K // KV_BUCKET) * KV_BUCKET
        gat = gathers[g]
        assert torch.equal(gat[:B, :K], gm.gather_slots)
        assert torch.equal(gat[:B, K:], gm.gather_slots[:, -1:].expand(B, Kp - K))
        assert (gat[B:] == d.trash[g]).all()
        valid = biases[g][:, :, 0, 0] == 0  # [n, Bp, Kp]
        assert torch.isinf(biases[g][~valid[:, :, None, None]]).all()
        assert torch.equal(valid[:, :B, :K], gm.mask[:, 0].permute(1, 0, 2))
        assert not valid[:, :B, K:].any()
        assert valid[:, B:, 0].all() and not valid[:, B:, 1:].any()
        slots = part(f"slots:{g}")
        assert torch.equal(slots[:, :B], gm.slot_mapping.view(B, n).t())
        assert (slots[:, B:] == d.trash[g]).all()
    assert Bp == d._bucket(B)


def test_a_short_table_is_refused():
    rng = np.random.default_rng(0)
    d = _decoder()
    specs = _specs(rng, 3, 1)
    specs[1].block_tables["full"] = specs[1].block_tables["full"][:1]
    with pytest.raises(AttentionMetadataError):
        d._call([1, 2, 3], specs, 1)


def test_a_released_block_in_the_window_is_refused():
    rng = np.random.default_rng(1)
    d = _decoder()
    specs = _specs(rng, 2, 1)
    s = specs[0]
    first = max(s.num_cached - WINDOWS["sliding"] + 1, 0) // BS
    s.block_tables["sliding"][first] = -1
    with pytest.raises(AttentionMetadataError):
        d._call([1, 2], specs, 1)
