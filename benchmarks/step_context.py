"""Does an engine step cost the same whatever came before and beside it? One prompt, timed
alone after the engine idled for different times and beside running decodes, on one
vLLM-CPU server, in interleaved rounds.

The step model prices a step by what it computes: a prompt's step is the same after an idle
engine as in a busy one, and a prompt beside ``B`` decodes costs the prompt plus the decodes.
On the 3M tiny model the loaded replays' prefills came out 25–30% longer than the fit predicts
(README, "Calibrate, then validate"), and one-off measurements hinted at both assumptions
failing. This measures them with repetitions, side by side:

* ``alone, idle X``: the prompt (``max_tokens=2``) sent ``X`` seconds after the previous probe
  ended (and a /metrics scrape, a few ms, so "idle 0" is an engine idle for those). vLLM's own
  ``request_prefill_time`` (scheduled to first token, scraped around the request) and the
  client's TTFT.
* ``alone, new length``: the same with a prompt one token shorter each round, a step size the
  server has never computed (the CPU backend may build kernels for a new shape on first use).
* ``beside 1, K prompts``: the prompt's tokens as ``K`` prompts sent at once while one request
  decodes, so one step admits them all: what a step's prompts cost beyond their tokens.
* ``arrivals that wait``: every slot (``max_num_seqs``) decoding, then prompts sent 30 ms
  apart that wait for a slot, so no step computes them: the extra time the decodes' steps take
  while requests arrive, per arrival (the server's work to receive a request).
* ``beside B``: ``B`` requests decoding (64-token prompts), then the prompt. The step that
  carries it is the longest gap in the decodes' streams around its first token
  (``calibration.measure_extract.mixed_step``, as the calibration reads mixed points); the
  decodes' ordinary step before it is their median gap. ``mixed − decode`` is what the prompt
  added to a busy step.

Each round runs every probe once, in a shuffled order (seeded), so the machine's drift falls
on all of them alike. Prints per probe the median and the interquartile range over rounds, and
the ratios that answer the question: ``alone idle X / alone idle 0`` (the cost of a cold
engine) and ``(mixed − decode) / alone idle 0`` per ``B`` (what the decodes beside a prompt
add beyond their own step).

Run: ``.venv/bin/python benchmarks/step_context.py [--model 3m|85m] [--prompt 1024] [--rounds 10]``
(a minute to start the server, then about a second a probe on the 3M model).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import httpx
import numpy as np
from fidelity import ENGINE, MODEL_85M  # the fidelity benchmark's server and model

from calibration.measure_extract import mixed_step
from calibration.measure_runner import ArrivalClock
from live.client import StreamResult, stream_completion
from live.scrape import metrics_delta, scrape
from live.server import VLLMServer
from live.tiny_model import TinyModelSpec, ensure_tiny_model
from live.tokens import PromptTokens
from sim.engine.request import RequestStatus

IDLE_S = (0.0, 0.05, 0.5)
#: The prompt alone, one token shorter each round: a length the server has not computed before.
NEW_LENGTH = "alone, new length"
#: The prompt's tokens split over this many prompts that one step admits together.
SPLITS = (2, 4, 8)
#: Requests that arrive while every slot decodes (they wait), and their spacing.
WAITING = "arrivals that wait"
#: What one probe measured, in seconds (NaN where it could not tell).
Measured = dict[str, float]
ARRIVALS = 6
ARRIVAL_SPACING_S = 0.03
BESIDE = (1, 4, 8)
DECODE_CONTEXT = 64
DECODE_TOKENS = 48
#: Arrivals each decode stream shows before the prompt is sent (steady decoding by then).
WARM_ARRIVALS = 4


class Probe:
    """Sends the probes to one server; every prompt is fresh (no prefix-cache hit)."""

    def __init__(self, url: str, model: str, vocab: int, prompt_tokens: int) -> None:
        self.url, self.model = url, model
        self.tokens = PromptTokens(vocab)
        self.prompt_tokens = prompt_tokens
        self.next_source = 1

    def prompt(self, length: int) -> list[int]:
        self.next_source += 1
        return self.tokens.stream(self.next_source, length)

    async def send(
        self,
        client: httpx.AsyncClient,
        prompt: list[int],
        max_tokens: int,
        clock: Callable[[], float] = time.perf_counter,
    ) -> StreamResult:
        result = await stream_completion(
            client, self.url, self.model, prompt, max_tokens, timeout_s=300, clock=clock
        )
        if result.status is not RequestStatus.OK:
            raise RuntimeError(f"a probe failed: {result.status.name}: {result.error}")
        return result

    async def alone(
        self, client: httpx.AsyncClient, idle_s: float, length: int | None = None
    ) -> dict[str, float]:
        """The prompt (or one of ``length`` tokens) alone after ``idle_s`` of an idle engine."""
        before = scrape(self.url)
        await asyncio.sleep(idle_s)
        result = await self.send(client, self.prompt(length or self.prompt_tokens), 2)
        prefill = metrics_delta(before, scrape(self.url)).prefill_time
        for _ in range(10):  # the server may count the request just after the stream ends
            if prefill.count:
                break
            await asyncio.sleep(0.01)
            prefill = metrics_delta(before, scrape(self.url)).prefill_time
        return {
            "ttft": result.token_times_s[0] - result.send_s,
            "prefill": prefill.sum if prefill.count == 1 else np.nan,
        }

    async def beside(
        self, client: httpx.AsyncClient, batch: int, parts: int = 1
    ) -> dict[str, float]:
        """The prompt sent while ``batch`` requests decode; with ``parts`` > 1, as that many
        prompts of its length over ``parts``, sent at once (they wait for the step in
        progress, so one step admits them all)."""
        clocks = [ArrivalClock(WARM_ARRIVALS) for _ in range(batch)]
        tasks = [
            asyncio.create_task(
                self.send(client, self.prompt(DECODE_CONTEXT), DECODE_TOKENS, clock=clocks[i])
            )
            for i in range(batch)
        ]
        await asyncio.gather(*(c.arrived.wait() for c in clocks))
        length = self.prompt_tokens // parts
        prefills = await asyncio.gather(
            *(self.send(client, self.prompt(length), 2) for _ in range(parts))
        )
        decodes = list(await asyncio.gather(*tasks))
        firsts = [p.token_times_s[0] for p in prefills]
        prefill = max(prefills, key=lambda p: p.token_times_s[0])
        prefill = replace(prefill, send_s=min(p.send_s for p in prefills))
        step = mixed_step(decodes, prefill, DECODE_CONTEXT)
        before = [np.diff([t for t in d.token_times_s if t < prefill.send_s]) for d in decodes]
        ordinary = float(np.median(np.concatenate(before))) if before else np.nan
        mixed = step.step_s if step is not None else np.nan
        if max(firsts) - min(firsts) > ordinary:
            mixed = np.nan  # the prompts' first tokens came from different steps
        return {
            "ttft": float(np.mean([p.token_times_s[0] - p.send_s for p in prefills])),
            "decode": ordinary,
            "mixed": mixed,
            "added": mixed - ordinary,
        }

    async def arrivals(self, client: httpx.AsyncClient, batch: int) -> dict[str, float]:
        """``batch`` (= ``max_num_seqs``) requests decoding, then :data:`ARRIVALS` prompts
        sent :data:`ARRIVAL_SPACING_S` apart, which wait (no slot) and so add no prompt step:
        what receiving a request costs the steps in progress. ``decode``: the mean step
        before the arrivals, ``mixed``: while they come, ``added``: the extra time per
        arrival (the steps' excess over the window, over the number of arrivals)."""
        clocks = [ArrivalClock(WARM_ARRIVALS) for _ in range(batch)]
        tasks = [
            asyncio.create_task(
                self.send(client, self.prompt(DECODE_CONTEXT), 3 * DECODE_TOKENS, clock=clocks[i])
            )
            for i in range(batch)
        ]
        await asyncio.gather(*(c.arrived.wait() for c in clocks))
        start = time.perf_counter()
        await asyncio.sleep(ARRIVALS * ARRIVAL_SPACING_S)  # the window before, as long
        waiting = []
        first = time.perf_counter()
        for _ in range(ARRIVALS):
            waiting.append(
                asyncio.create_task(self.send(client, self.prompt(self.prompt_tokens), 2))
            )
            await asyncio.sleep(ARRIVAL_SPACING_S)
        last = time.perf_counter()
        decodes = list(await asyncio.gather(*tasks))
        await asyncio.gather(*waiting)
        ticks = np.array(decodes[0].token_times_s)
        if ticks[-1] < last:
            return {"ttft": np.nan, "decode": np.nan, "mixed": np.nan, "added": np.nan}

        def gaps(lo: float, hi: float) -> np.ndarray:
            inside = ticks[(ticks > lo) & (ticks <= hi)]
            return np.diff(inside)

        before, during = gaps(start, first), gaps(first, last)
        excess = (during.mean() - before.mean()) * during.size
        return {
            "ttft": np.nan,
            "decode": float(before.mean()),
            "mixed": float(during.mean()),
            "added": float(excess / ARRIVALS),
        }


def probe_table(probe: Probe) -> dict[str, Callable[[httpx.AsyncClient], Awaitable[Measured]]]:
    """Every probe of a round, by the name its row is printed under."""
    new_lengths = iter(range(probe.prompt_tokens - 1, 0, -1))
    table: dict[str, Callable[[httpx.AsyncClient], Awaitable[Measured]]] = {
        f"alone, idle {s:g} s": partial(probe.alone, idle_s=s) for s in IDLE_S
    }
    table |= {f"beside {b}": partial(probe.beside, batch=b) for b in BESIDE}
    table[NEW_LENGTH] = lambda client: probe.alone(client, 0.0, next(new_lengths))
    table |= {f"beside 1, {k} prompts": partial(probe.beside, batch=1, parts=k) for k in SPLITS}
    table[WAITING] = partial(probe.arrivals, batch=ENGINE.max_num_seqs)
    return table


async def run_rounds(probe: Probe, rounds: int, seed: int) -> dict[str, list[Measured]]:
    table = probe_table(probe)
    names = list(table)
    results: dict[str, list[Measured]] = {name: [] for name in names}
    rng = np.random.default_rng(seed)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(limits=limits, timeout=300) as client:
        await probe.send(client, probe.prompt(probe.prompt_tokens), 2)  # warm-up
        for _ in range(rounds):
            for i in rng.permutation(len(names)):
                results[names[i]].append(await table[names[i]](client))
    return results


def _ms(values: list[float]) -> str:
    """Median [quartiles] in ms of the finite values."""
    finite = np.array([v for v in values if np.isfinite(v)]) * 1e3
    if not finite.size:
        return "—"
    q1, q2, q3 = np.percentile(finite, [25, 50, 75])
    return f"{q2:6.1f} [{q1:5.1f}, {q3:5.1f}]"


def _median(rows: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows if np.isfinite(r[key])]
    return float(np.median(values)) if values else float("nan")


def report(results: dict[str, list[dict[str, float]]]) -> None:
    print(f"{'probe':<18}{'n':>3}  {'client TTFT ms':<24}{'vLLM prefill ms':<24}", end="")
    print(f"{'decode step ms':<24}{'mixed step ms':<24}{'mixed − decode ms':<24}")
    for name, rows in results.items():
        cells = [_ms([r.get(k, np.nan) for r in rows]) for k in ("ttft", "prefill")]
        cells += [_ms([r.get(k, np.nan) for r in rows]) for k in ("decode", "mixed", "added")]
        print(f"{name:<18}{len(rows):>3}  " + "".join(f"{c:<24}" for c in cells))
    base = _median(results[f"alone, idle {IDLE_S[0]:g} s"], "prefill")
    base_ttft = _median(results[f"alone, idle {IDLE_S[0]:g} s"], "ttft")
    print(f"\nratios of medians, against the prompt alone after {IDLE_S[0]:g} s idle")
    for idle in IDLE_S[1:]:
        rows = results[f"alone, idle {idle:g} s"]
        print(
            f"  alone, idle {idle:g} s: vLLM prefill ×{_median(rows, 'prefill') / base:.2f}, "
            f"client TTFT ×{_median(rows, 'ttft') / base_ttft:.2f}"
        )
    rows = results[NEW_LENGTH]
    print(
        f"  {NEW_LENGTH}: vLLM prefill ×{_median(rows, 'prefill') / base:.2f}, "
        f"client TTFT ×{_median(rows, 'ttft') / base_ttft:.2f}"
    )
    for parts in SPLITS:
        rows = results[f"beside 1, {parts} prompts"]
        one = _median(results["beside 1"], "added")
        print(
            f"  {parts} prompts of 1/{parts} the length, beside 1: (mixed − decode) ×"
            f"{_median(rows, 'added') / one:.2f} of the one prompt's"
        )
    rows = results[WAITING]
    print(
        f"  {WAITING} (all {ENGINE.max_num_seqs} slots decoding): each adds "
        f"{_median(rows, 'added') * 1e3:.2f} ms to the steps in progress (step "
        f"{_median(rows, 'decode') * 1e3:.2f} ms before, {_median(rows, 'mixed') * 1e3:.2f} "
        "ms while they come)"
    )
    for batch in BESIDE:
        rows = results[f"beside {batch}"]
        print(
            f"  beside {batch}: (mixed − decode) / alone prefill "
            f"×{_median(rows, 'added') / base:.2f}, client TTFT "
            f"×{_median(rows, 'ttft') / base_ttft:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("3m", "85m"), default="3m")
    parser.add_argument("--prompt", type=int, default=1024, help="prompt tokens of the probe")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    spec = MODEL_85M if args.model == "85m" else TinyModelSpec()
    model_dir = ensure_tiny_model(spec)
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    work = Path(tempfile.mkdtemp(prefix="servesim-step-context-"))
    with VLLMServer(str(model_dir), ENGINE, log_path=work / "server.log") as server:
        probe = Probe(server.url, server.model_name, vocab, args.prompt)
        results = asyncio.run(run_rounds(probe, args.rounds, args.seed))
    print(f"model {args.model}, prompt {args.prompt} tokens, {args.rounds} rounds, {ENGINE}")
    report(results)
    (work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"raw: {work / 'results.json'}")


if __name__ == "__main__":
    main()
