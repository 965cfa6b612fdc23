"""The in-process scenarios: prefill, decode, batch, spec. Each takes loaded engines and returns a report."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

import torch

from augury.bench.machine import measure_bandwidth, measure_matmul
from augury.bench.model_facts import ModelFacts
from augury.bench.options import BenchOptions
from augury.bench.peers.base import Peer
from augury.bench.prompts import batch_prompts, filler_ids, load_task_set
from augury.bench.report import ScenarioReport, Target
from augury.bench.runner import CaseSpec, Measure, Sample, run_case, run_cases
from augury.bench.stats import paired_ratios
from augury.engine.threads import run_in_fresh_thread


@dataclass
class Limit:
    """The physical limit, re-measured each repetition so it sees the same machine load as the engines."""

    facts: ModelFacts
    device: torch.device

    # measured in a thread that exits: a parallel op on the harness's own thread would leave an
    # OpenMP pool behind and slow augury's engine thread (augury/engine/threads.py)
    def decode(self, batch: int = 1) -> Sample:
        bw = run_in_fresh_thread(lambda: measure_bandwidth(self.device))
        return Sample(self.facts.decode_limit(bw, batch), {"bandwidth_GBps": bw / 1e9})

    def prefill(self, prompt_len: int, dtype: torch.dtype = torch.float32) -> Sample:
        fl = run_in_fresh_thread(lambda: measure_matmul(self.device, dtype=dtype))
        return Sample(self.facts.prefill_limit(fl, prompt_len), {"matmul_GFLOPs": fl / 1e9})


@dataclass
class Setup:
    """What a scenario runs on: augury (the subject), its peers, the limit probe and the tokenizer."""

    opts: BenchOptions
    augury: Peer
    tokenizer: Any
    peers: dict[str, Peer]
    limit: Limit | None
    skipped: dict[str, str]


def _case_label(n: int) -> str:
    return f"prompt {n // 1024}k" if n % 1024 == 0 else f"prompt {n}"


def _report(name: str, headline: str, s: Setup, cases: list) -> ScenarioReport:
    return ScenarioReport(name, headline, cases, config=s.opts.engine_dict(), skipped=dict(s.skipped))


def _target(rep: ScenarioReport, case: str, peer: str, goal: float, label: str) -> None:
    c = rep.case(case)
    rep.targets.append(Target(label, c.ratios.get(peer) if c else None, goal))


def prefill(s: Setup) -> ScenarioReport:
    cases = []
    for n in s.opts.prefill_lens:
        ids = filler_ids(s.tokenizer, n)
        series: dict[str, Measure] = {}
        for p in [s.augury, *s.peers.values()]:
            series[p.name] = (lambda p=p: Sample(p.generate(ids, 1).prefill_rate))
        if s.limit:
            series["limit"] = lambda n=n: s.limit.prefill(n)
        cases.append(run_case(_case_label(n), "tok/s", s.augury.name, series, s.opts.reps, s.opts.warmup))
    rep = _report("prefill", cases[0].name, s, cases)
    _target(rep, cases[0].name, "llama.cpp", 1.0, f"prefill {cases[0].name} vs llama.cpp")
    rep.notes.append("prefill tok/s = prompt tokens / time to the first generated token; prefix caching off")
    return rep


def decode(s: Setup) -> ScenarioReport:
    o = s.opts
    ids = filler_ids(s.tokenizer, o.decode_prompt)
    series: dict[str, Measure] = {
        p.name: (lambda p=p: Sample(p.generate(ids, o.decode_tokens, ignore_eos=True).decode_rate))
        for p in [s.augury, *s.peers.values()]
    }
    if s.limit:
        series["limit"] = lambda: s.limit.decode(1)
    case = run_case("B=1", "tok/s", s.augury.name, series, o.reps, o.warmup)
    rep = _report("decode", "B=1", s, [case])
    _target(rep, "B=1", "llama.cpp", 1.25, "decode B=1 vs llama.cpp")
    if "llama.cpp-q4head" in s.peers:
        _target(rep, "B=1", "llama.cpp-q4head", 1.25, "decode B=1 vs llama.cpp, its head at augury's bits")
        rep.notes.append("llama.cpp-q4head: llama.cpp on a copy of the GGUF whose token embedding / output head "
                         "has the layers' 4 bits, as augury's int4 head (the stock file keeps it at 8.5 bits: "
                         "llama.cpp reads more bytes a token than augury)")
    rep.notes.append(f"{o.decode_tokens} greedy tokens after a {o.decode_prompt}-token prompt; "
                     "tok/s = (tokens - 1) / time after the first token")
    return rep


def batch(s: Setup) -> ScenarioReport:
    o = s.opts
    specs = []
    for b in o.batch_sizes:
        prompts = batch_prompts(s.tokenizer, b, o.batch_prompt)
        series: dict[str, Measure] = {}
        for p in [s.augury, *s.peers.values()]:
            if p.name == "hf" and b > o.hf_max_batch:
                continue
            series[p.name] = _batch_measure(p, prompts, o.batch_tokens)
        if s.limit:
            series["limit"] = lambda b=b: s.limit.decode(b)
        specs.append(CaseSpec(f"B={b}", "tok/s", s.augury.name, series))
    # the batch sizes interleave within each repetition: the B=8 / B=1 target divides two cases
    cases = run_cases(specs, o.reps, o.warmup)
    head = "B=8" if 8 in o.batch_sizes else cases[-1].name
    rep = _report("batch", head, s, cases)
    one, eight = rep.case("B=1"), rep.case("B=8")
    if one and eight:
        a1, a8 = one.results["augury"], eight.results["augury"]
        rep.targets.append(Target("augury B=8 aggregate / augury B=1", a8.median / a1.median, 3.0))
        paired = paired_ratios(a8.samples, a1.samples)
        if paired:
            rep.notes.append(f"B=8 / B=1 per repetition (the two measured in the same repetition): median "
                             f"{statistics.median(paired):.2f}x, {min(paired):.2f}-{max(paired):.2f}x")
        d1, d8 = (c.extras.get("augury", {}).get("decode phase") for c in (one, eight))
        if d1 and d8:
            rep.notes.append(f"decode phase alone (llama-batched-bench's S_TG: tokens after each sequence's first "
                             f"over the time after the last first token; the aggregate above also counts the "
                             f"prompts' prefill): B=8 {d8:.0f}, B=1 {d1:.0f} tok/s, {d8 / d1:.2f}x")
    if "llama.cpp" in s.peers:
        rep.notes.append("llama.cpp runs one sequence at a time through llama-cpp-python (its server too): "
                         "its aggregate is its single-sequence rate")
    rep.notes.append(f"aggregate tok/s = all generated tokens / wall time, {o.batch_prompt}-token prompts, "
                     f"{o.batch_tokens} tokens each; hf runs up to B={o.hf_max_batch}")
    return rep


def _batch_measure(p: Peer, prompts: list[list[int]], n: int) -> Measure:
    def measure() -> Sample:
        bt = p.generate_batch(prompts, n)
        if bt is None:  # a peer that decodes one sequence at a time: serial aggregate = its own rate
            g = p.generate(prompts[0], n, ignore_eos=True)
            return Sample(g.gen_tokens / g.total_s)
        dr = bt.decode_rate
        return Sample(bt.rate, {"decode phase": dr} if dr else {})
    return measure


def spec(s: Setup) -> ScenarioReport:
    o = s.opts
    cases = []
    for set_name in o.spec_sets:
        prompts = [s.tokenizer.encode_chat(t.messages) for t in load_task_set(set_name)]
        series: dict[str, Measure] = {}
        warm: dict[str, Measure] = {}
        runs: list[tuple[str, Peer, str | None]] = [(s.augury.name, s.augury, None)]
        runs += [(f"{s.augury.name}-{m}", s.augury, m) for m in o.spec_methods]
        runs += [(p.name, p, None) for p in s.peers.values()]
        for label, p, method in runs:
            series[label] = _task_set_measure(p, prompts, o.spec_max_tokens, method)
            warm[label] = _task_set_measure(p, prompts[:1], o.spec_max_tokens, method)
        subject = f"{s.augury.name}-{o.spec_methods[0]}" if o.spec_methods else s.augury.name
        cases.append(run_case(set_name, "tok/s", subject, series, o.reps, o.warmup, warmups=warm))
    rep = _report("spec", cases[0].name if cases else "", s, cases)
    if "grounded" in o.spec_sets and "ngram" in o.spec_methods:
        _target(rep, "grounded", s.augury.name, 2.0, "ngram vs augury plain, grounded set")
        for p in s.peers.values():
            if "pld" in p.name:
                _target(rep, "grounded", p.name, 1.0, f"ngram vs {p.name}, grounded set")
    rep.notes.append(f"greedy, up to {o.spec_max_tokens} tokens per task (stops at EOS), chat template applied; "
                     "tok/s = decode tokens over decode time summed over the set; "
                     "extras: mean accepted length = tokens per verify round")
    return rep


def _task_set_measure(p: Peer, prompts: list[list[int]], max_tokens: int, method: str | None) -> Measure:
    def measure() -> Sample:
        toks, secs, acc = 0, 0.0, []
        for ids in prompts:
            g = p.generate(ids, max_tokens, ignore_eos=False, method=method)
            toks += max(g.gen_tokens - 1, 0)
            secs += g.total_s - g.ttft_s
            if "mean_accepted_length" in g.extras:
                acc.append(g.extras["mean_accepted_length"])
        ex = {"accepted_len": sum(acc) / len(acc)} if acc else {}
        return Sample(toks / secs if secs > 0 else 0.0, ex)
    return measure


SCENARIOS: dict[str, Callable[[Setup], ScenarioReport]] = {
    "prefill": prefill, "decode": decode, "batch": batch, "spec": spec,
}
