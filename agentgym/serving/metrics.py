"""What the OpenAI-compatible server counts, and ``GET /metrics`` in the Prometheus text format.

Names follow vLLM's ``vllm:`` metrics with an ``agentgym:`` prefix where one exists, so dashboards built for
``vllm serve`` need only the prefix changed.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["BatchStats", "Histogram", "TokenRate", "prometheus_text"]

# vLLM's buckets for time to first token and inter-token latency (seconds), so the same dashboards read them.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)


class Histogram:
    """A Prometheus histogram (cumulative buckets, sum, count); observed from the decode thread, read by /metrics."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self.counts[bisect.bisect_left(self.buckets, value)] += 1
            self.sum += value
            self.count += 1

    def samples(self) -> tuple[list[tuple[str, int]], float, int]:
        """``([(le, cumulative count)], sum, count)``, the last ``le`` being ``+Inf``."""
        with self._lock:
            counts, total, n = list(self.counts), self.sum, self.count
        out, running = [], 0
        for bound, c in zip([*map(str, self.buckets), "+Inf"], counts):
            running += c
            out.append((bound, running))
        return out, total, n


class TokenRate:
    """Tokens generated per second over the last ``window_s`` seconds (per-second bins, so memory stays fixed)."""

    def __init__(self, window_s: int = 10) -> None:
        self.window_s = window_s
        self._bins: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(self, now: float, tokens: int = 1) -> None:
        second = int(now)
        with self._lock:
            self._bins[second] = self._bins.get(second, 0) + tokens
            if len(self._bins) > 2 * self.window_s:
                for old in [s for s in self._bins if s <= second - self.window_s]:
                    del self._bins[old]

    def per_second(self, now: float | None = None) -> float:
        now = time.perf_counter() if now is None else now
        with self._lock:
            total = sum(c for s, c in self._bins.items() if now - self.window_s < s + 1 <= now + 1)
        return total / self.window_s


@dataclass
class BatchStats:
    """Counters of the batcher, exposed on ``app.state.stats``, ``GET /health`` and ``GET /metrics``.

    Attributes:
        generate_calls: How many ``policy.generate`` calls ran (one per batch).
        requests: How many sequences those calls generated.
        max_batch_seen: Largest batch run so far.
        tokens_generated: Completion tokens generated in total (rows cancelled midway count what they made).
        prompt_tokens: Prompt tokens of the sequences run.
        queued: Sequences waiting right now.
        running: Sequences in the batch running right now.
        aborted: Sequences stopped early because their client went away.
    """

    generate_calls: int = 0
    requests: int = 0
    max_batch_seen: int = 0
    tokens_generated: int = 0
    prompt_tokens: int = 0
    queued: int = 0
    running: int = 0
    aborted: int = 0
    #: Seconds from a sequence's submission to its first token, and between its successive tokens (streamed path).
    time_to_first_token: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS), repr=False)
    inter_token_latency: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS), repr=False)
    token_rate: TokenRate = field(default_factory=TokenRate, repr=False)

    def as_dict(self) -> dict[str, int]:
        return {
            "generate_calls": self.generate_calls, "requests": self.requests, "max_batch_seen": self.max_batch_seen,
            "tokens_generated": self.tokens_generated, "prompt_tokens": self.prompt_tokens, "queued": self.queued,
            "running": self.running, "aborted": self.aborted,
        }


def prometheus_text(model_name: str, stats: BatchStats, finished: Mapping[str, int],
                    responses: Mapping[tuple[str, int], int]) -> str:
    """``/metrics`` in the Prometheus text exposition format (version 0.0.4), every series labelled with the
    model name. Names: ``agentgym:generation_tokens_total``, ``agentgym:prompt_tokens_total``,
    ``agentgym:sequences_total``, ``agentgym:generate_calls_total``, ``agentgym:sequences_aborted_total``,
    ``agentgym:request_success_total{finished_reason}`` (choices), ``agentgym:http_responses_total{endpoint,
    status}``, and the gauges ``agentgym:num_requests_waiting``, ``agentgym:num_requests_running``,
    ``agentgym:max_batch_size_seen`` (vLLM's ``vllm:`` metrics with our prefix where one exists).

    Args:
        model_name: The served model's id (the ``model_name`` label).
        stats: The batcher's counters.
        finished: Choices returned so far, by finish reason.
        responses: HTTP responses of the API endpoints so far, by ``(endpoint, status)``.
    """
    model = model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: Sequence[tuple[str, float]]) -> None:
        lines.append(f"# HELP agentgym:{name} {help_text}")
        lines.append(f"# TYPE agentgym:{name} {kind}")
        for labels, value in samples:
            lines.append(f'agentgym:{name}{{model_name="{model}"{labels}}} {value}')

    metric("generation_tokens_total", "counter", "Completion tokens generated.", [("", stats.tokens_generated)])
    metric("prompt_tokens_total", "counter", "Prompt tokens of the sequences run.", [("", stats.prompt_tokens)])
    metric("sequences_total", "counter", "Sequences generated.", [("", stats.requests)])
    metric("generate_calls_total", "counter", "Batches run (policy.generate calls).", [("", stats.generate_calls)])
    metric("sequences_aborted_total", "counter", "Sequences stopped early because the client went away.",
           [("", stats.aborted)])
    metric("request_success_total", "counter", "Choices returned, by finish reason.",
           [(f',finished_reason="{reason}"', count) for reason, count in sorted(finished.items())])
    metric("http_responses_total", "counter", "HTTP responses of the API endpoints, by endpoint and status.",
           [(f',endpoint="{endpoint}",status="{status}"', count)
            for (endpoint, status), count in sorted(responses.items())])
    metric("num_requests_waiting", "gauge", "Sequences queued for the next batch.", [("", stats.queued)])
    metric("num_requests_running", "gauge", "Sequences in the running batch.", [("", stats.running)])
    metric("max_batch_size_seen", "gauge", "Largest batch run so far.", [("", stats.max_batch_seen)])
    metric("generation_tokens_per_second", "gauge", "Tokens generated per second over the last 10 s.",
           [("", round(stats.token_rate.per_second(), 3))])
    for name, hist, help_text in (
            ("time_to_first_token_seconds", stats.time_to_first_token, "Time from submission to the first token."),
            ("inter_token_latency_seconds", stats.inter_token_latency, "Time between successive tokens of a sequence.")):
        buckets, total, count = hist.samples()
        metric(name, "histogram", help_text, [])
        for le, c in buckets:
            lines.append(f'agentgym:{name}_bucket{{model_name="{model}",le="{le}"}} {c}')
        lines.append(f'agentgym:{name}_sum{{model_name="{model}"}} {total}')
        lines.append(f'agentgym:{name}_count{{model_name="{model}"}} {count}')
    return "\n".join(lines) + "\n"
