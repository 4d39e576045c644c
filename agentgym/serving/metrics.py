"""What the OpenAI-compatible server counts, and ``GET /metrics`` in the Prometheus text format.

Names follow vLLM's ``vllm:`` metrics with an ``agentgym:`` prefix where one exists, so dashboards built for
``vllm serve`` need only the prefix changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["BatchStats", "prometheus_text"]


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
    return "\n".join(lines) + "\n"
