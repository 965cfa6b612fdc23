"""Scheduler: budget, chunked prefill, admission by blocks, preemption (no model)."""

from augury.engine.request import Request, RequestStatus
from augury.engine.scheduler import Scheduler, SchedulerConfig
from augury.engine.types import SamplingParams
from augury.kv.block_manager import BlockManager, KVGroup


def make(n_blocks=64, budget=32, max_seqs=4):
    bm = BlockManager([KVGroup("full", n_blocks)], 4)
    return Scheduler(SchedulerConfig(max_seqs, budget, 1000), bm), bm


def fake_step(s: Scheduler, out, token=7):
    for seq in out.seqs:
        r = seq.request
        r.num_computed += seq.num_new
        if seq.sample:
            r.output_ids.append(token)
        s.commit(r)


def test_chunked_prefill_then_decode():
    s, _ = make(budget=8)
    r = Request("a", list(range(20)), SamplingParams())
    s.add(r)
    chunks = []
    for _ in range(3):
        out = s.schedule()
        chunks.append((out.seqs[0].num_new, out.seqs[0].sample))
        fake_step(s, out)
    assert chunks == [(8, False), (8, False), (4, True)]
    out = s.schedule()
    assert out.seqs[0].num_new == 1 and out.seqs[0].sample


def test_budget_shared_and_fifo_admission():
    s, _ = make(budget=16, max_seqs=8)
    reqs = [Request(str(i), list(range(10)), SamplingParams()) for i in range(3)]
    for r in reqs:
        s.add(r)
    out = s.schedule()
    assert [(q.request.request_id, q.num_new) for q in out.seqs] == [("0", 10), ("1", 6)]
    assert reqs[2].status is RequestStatus.WAITING


def test_max_num_seqs():
    s, _ = make(budget=100, max_seqs=2)
    for i in range(3):
        s.add(Request(str(i), [1, 2], SamplingParams()))
    out = s.schedule()
    assert len(out.seqs) == 2


def test_preemption_when_blocks_run_out_and_all_blocks_return():
    s, bm = make(n_blocks=4, budget=100, max_seqs=4)
    a = Request("a", list(range(8)), SamplingParams())
    b = Request("b", list(range(100, 108)), SamplingParams())
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert len(out.seqs) == 2  # 2 blocks each
    fake_step(s, out)  # both now 9 tokens: need a 3rd block each
    out = s.schedule()
    assert out.preempted == [b] and [q.request for q in out.seqs] == [a]
    assert b.status is RequestStatus.WAITING and b.num_computed == 0
    fake_step(s, out)
    s.remove(a)
    out = s.schedule()
    # b's tail block was evicted to make room for a; its first block is still a prefix hit
    assert [q.request for q in out.seqs] == [b] and out.seqs[0].num_new == 5 and b.num_cached == 4
    s.remove(b)
    assert bm.num_free_blocks() == 4


def test_drafts_counted_and_dropped_before_preempting():
    s, bm = make(n_blocks=3, budget=100)
    a = Request("a", list(range(7)), SamplingParams())
    s.add(a)
    fake_step(s, s.schedule())  # 8 tokens, 7 computed
    a.draft_ids = [1, 2, 3, 4, 5]
    out = s.schedule()
    assert out.seqs[0].num_draft == 0 or out.seqs[0].num_draft + 8 <= 12
    a.draft_ids = [1, 2]
    out = s.schedule()
    assert out.seqs[0].num_new == 1 and out.seqs[0].num_draft == 2


def test_preemption_picks_a_victim_of_the_needy_class():
    from augury.kv.block_manager import BlockClasses

    bm = BlockManager([KVGroup("full", 8, None, (("a", 4), ("b", 4)))], 4)
    s = Scheduler(SchedulerConfig(4, 64, 1000), bm)
    ra = Request("ra", list(range(7)), SamplingParams())  # class a: 2 blocks, grows into a 3rd and 4th
    rb = Request("rb", list(range(7)), SamplingParams())  # class b, admitted later
    ra2 = Request("ra2", list(range(3)), SamplingParams())
    ra.kv_classes, rb.kv_classes, ra2.kv_classes = BlockClasses("a"), BlockClasses("b"), BlockClasses("a")
    for r in (ra, ra2, rb):
        s.add(r)
    for _ in range(6):
        out = s.schedule()
        assert rb not in out.preempted  # class b's blocks would not help class a
        fake_step(s, out)
    assert ra2.status is RequestStatus.WAITING and rb.status is RequestStatus.RUNNING
