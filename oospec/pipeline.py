"""`oospec.load`: a target model, its drafter and (for oospec) the sidecar process, in one call.

The engine may not know about sidecars or drafters (they sit above it: see tests/test_layering.py), so the
one-call Python path lives here, above both, and `oospec.load` re-exports it. The CLI's generate and demo use
it too, so that the Python path and the commands start the same sidecar and split the cores the same way.

    import oospec
    with oospec.load("qwen2.5-coder-1.5b") as pipe:  # method oospec: the shipped sidecar and its adapter
        result = pipe.generate(messages, tools=tools)
        print(result.text, pipe.tool_calls(result))
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from oospec.drafters import make_drafter, uses_sidecar
from oospec.engine.drafting import Drafter, Request
from oospec.engine.engine import Engine, Result
from oospec.engine.prefix_cache import PrefixCache
from oospec.errors import ChatTemplateError, OospecError
from oospec.models.registry import (DEFAULT_BUDGET, DEFAULT_DEVICE, DEFAULT_DTYPE, DEFAULT_METHOD, DEFAULT_PREFIX_CACHE_MB,
                                     DEFAULT_TARGET)
from oospec.sidecar.process import SidecarClient, SidecarSettings, make_sidecar
from oospec.tools.dialects import DEFAULT_DIALECT, ToolCall, get_dialect


def target_threads(threads: int | None, sidecar: SidecarSettings | None) -> int | None:
    """The target's torch threads (oospec.engine.threads.split_cores): `threads` when given; else, while a
    sidecar runs on the CPU, all of torch's cores less the sidecar's; else None (torch's default: all cores)."""
    if threads or sidecar is None or sidecar.device != "cpu":
        return threads
    import torch

    from oospec.engine.threads import split_cores

    return split_cores(torch.get_num_threads(), threads, sidecar.threads, sidecar.device)[0]


@dataclass
class Pipeline:
    """An engine and the drafter every `generate` call uses (it learns across calls); owns the sidecar process."""

    engine: Engine
    drafter: Drafter
    method: str
    sidecar: SidecarClient | None = None
    budget: int = DEFAULT_BUDGET
    # The KV of earlier calls' prompts and replies: an agent resends its conversation every turn, and only what
    # is new is prefilled (prefix_cache=None in a call turns it off for that call).
    prefix_cache: PrefixCache | None = field(
        default_factory=lambda: PrefixCache(int(DEFAULT_PREFIX_CACHE_MB * 2**20)))

    def generate(self, request: Request | list[dict], tools: list[dict] | None = None, **fields) -> Result:
        """Engine.generate with this pipeline's drafter, budget and prefix cache (`prefix_cache=None` turns it off
        for this call); `request` a Request, or chat messages with `tools` and Request fields as keywords. Chat
        tools the template cannot render are refused (ChatTemplateError) rather than silently dropped."""
        prefix_cache = fields.pop("prefix_cache", self.prefix_cache)
        on_tokens = fields.pop("on_tokens", None)
        if not isinstance(request, Request):
            request = Request.chat(request, tools, **fields)
        elif tools is not None or fields:
            raise TypeError("give a Request, or messages with Request fields as keywords, not both")
        if request.chat_tools and request.messages is not None:
            check_template_renders_tools(self.engine, request.messages, request.chat_tools)
        if request.budget is None:
            request = replace(request, budget=self.budget)
        return self.engine.generate(request, drafter=self.drafter, prefix_cache=prefix_cache, on_tokens=on_tokens)

    def tool_calls(self, result: Result, dialect: str = DEFAULT_DIALECT) -> list[ToolCall]:
        """The tool calls in a reply, read as the target writes them (`dialect`, see oospec.tools.dialects)."""
        return get_dialect(dialect).parse(result.text)

    @property
    def threads(self) -> int:
        """The target's torch threads."""
        import torch

        return torch.get_num_threads()

    @property
    def sidecar_report(self):
        """The last request's SidecarReport (oospec.drafters.sidecar), or None without a sidecar."""
        return getattr(self.drafter, "report", None) if self.sidecar is not None else None

    def close(self) -> None:
        if self.sidecar is not None:
            self.sidecar.close()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(model: str = DEFAULT_TARGET, method: str = DEFAULT_METHOD, *, sidecar: SidecarSettings | str | None = None,
         threads: int | None = None, budget: int = DEFAULT_BUDGET, dtype: str = DEFAULT_DTYPE,
         device: str = DEFAULT_DEVICE, optimize: bool = True, **drafter_options) -> Pipeline:
    """A Pipeline for `model` decoding with `method` (default oospec). sidecar: its model name, or SidecarSettings
    (default: the shipped sidecar and its adapter, on the CPU); started only for the methods that use one.
    threads: the target's torch threads (default: all cores less the sidecar's, see `target_threads`).
    drafter_options: passed to the drafter (e.g. memory=CallMemory(path) for retrieval, toolspec, oospec)."""
    settings = None
    if uses_sidecar(method):
        settings = sidecar if isinstance(sidecar, SidecarSettings) else SidecarSettings(
            **({"model": sidecar} if sidecar else {}))
    use_threads(target_threads(threads, settings))
    # The target first: a bad model fails before the sidecar's process is started (it takes seconds to load).
    engine = Engine.from_pretrained(model, dtype=dtype, device=device, optimize=optimize)
    return attach(engine, method, settings, budget, **drafter_options)


def attach(engine: Engine, method: str, sidecar: SidecarSettings | None, budget: int = DEFAULT_BUDGET,
           **drafter_options) -> Pipeline:
    """A Pipeline around a loaded engine: the drafter of `method`, and the sidecar's process when `sidecar` is
    given (the caller's SidecarSettings; None for the methods that use no sidecar)."""
    drafter, client = start_drafter(method, sidecar, **drafter_options)
    return Pipeline(engine, drafter, method, client, budget)


def start_drafter(method: str, sidecar: SidecarSettings | None,
                  **drafter_options) -> tuple[Drafter, SidecarClient | None]:
    """The drafter of `method` and the sidecar process it drafts with (started from `sidecar`, when given): every
    command and oospec.load start them here, so the same settings give the same sidecar (adapter auto)."""
    client = make_sidecar(sidecar) if sidecar is not None else None
    if client is not None:
        drafter_options["sidecar"] = client
    try:
        return make_drafter(method, **drafter_options), client
    except (ValueError, TypeError) as exc:
        if client is not None:
            client.close()
        raise OospecError(f"cannot make drafter {method!r}: {exc}") from None


def use_threads(threads: int | None) -> None:
    """Run torch with `threads` threads (None: leave torch's choice)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


def check_template_renders_tools(engine: Engine, messages: list[dict], tools: list[dict]) -> None:
    """ChatTemplateError when the model's chat template ignores `tools` (the prompt is the same without them):
    the model would then answer without ever seeing the tools."""
    tokenizer = engine.tokenizer

    def render(with_tools):
        return tokenizer.apply_chat_template(messages, tools=with_tools, add_generation_prompt=True, tokenize=False)

    try:
        ignored = render(tools) == render(None)
    except Exception:  # the template's own complaints surface, clearly, from Engine.encode
        return
    if ignored:
        name = getattr(tokenizer, "name_or_path", "") or "this model"
        raise ChatTemplateError(f"the chat template of {name} cannot render tools (the prompt is the same with "
                                "and without them): describe the tools in a system message, or use a model whose "
                                "template takes tools (e.g. qwen2.5-coder-1.5b)")


def sidecar_lines(report) -> list[str]:
    """A SidecarReport in words: what the sidecar predicted, how sure it was and when its payload arrived."""
    if report is None:
        return []
    plan = report.schedule
    if not report.submitted:
        if plan and not plan["run"]:
            return [f"sidecar not asked: its job ({plan['new_tokens']} new prompt tokens, ~{plan['job_s']:.1f} s) would "
                    f"cost the target ~{plan['cost_s']:.1f} s of prefill for ~{plan['gain_s']:.1f} s of decoding saved "
                    f"(the cost model, oospec.drafters.sidecar_schedule); drafted as toolspec"]
        return []
    if report.function:
        when = ("before the target's first decode step" if report.tokens_written_at_arrival == 1
                else f"after the target had written {report.tokens_written_at_arrival} tokens" if report.arrived
                else "after the target had finished")
        sure = f", call probability {report.call_probability:.2f}" if report.call_probability is not None else ""
        lines = [f"sidecar predicted {report.function}({report.arguments or {}}){sure}",
                 f"  payload {report.payload_bytes} bytes, computed in {report.compute_s or 0:.2f} s, arrived {when}"]
        if report.alternatives:
            lines.append("  alternatives: " + ", ".join(str(a.get("function")) for a in report.alternatives))
        if report.followup:
            f = report.followup
            lines.append(f"  the target chose {f.function}: its slots were asked for after "
                         f"{f.tokens_written_at_submit} tokens"
                         + (f" and arrived after {f.tokens_written_at_arrival}" if f.arrived else ""))
        return lines
    if report.no_call:
        return [f"sidecar expects no call (call probability {report.call_probability:.2f})"]
    return [f"sidecar sent no payload ({report.fault or 'none arrived in time'}): decoding went on without hints"]


__all__ = ["Pipeline", "attach", "check_template_renders_tools", "load", "sidecar_lines", "start_drafter",
           "target_threads", "use_threads"]
