"""The targets of the GPU fast path, and the table that shows a measure_synthetic result next to them."""

from __future__ import annotations

import operator

# model -> [(check, comparison, threshold)]; the checks are computed by _check_values below.
TARGETS: dict[str, list[tuple[str, str, float]]] = {
    "llama-3.1-8b": [("decode roofline fraction", ">=", 0.8), ("decode / transformers", ">=", 3.0),
                     ("follow-up TTFT ms", "<=", 30.0)],
    "llama-3.2-1b": [("decode roofline fraction", ">=", 0.5)],
}
_COMPARE = {">=": operator.ge, "<=": operator.le}


def _check_values(result: dict, check: str) -> list[tuple[str, float | None]]:
    """(where, value) pairs a target applies to; value None when it was not measured."""
    decode = result.get("decode") or []
    if check == "decode roofline fraction":
        return [(f"@{row['context_tokens']}", row.get("roofline_fraction")) for row in decode] or [("", None)]
    if check == "decode / transformers":
        hf = result.get("hf_decode")
        ours = decode[0]["tokens_per_s"] if decode else None
        ratio = ours / hf["tokens_per_s"] if ours and hf and hf.get("tokens_per_s") else None
        return [(f"@{hf['context_tokens']}" if hf else "", ratio)]
    if check == "follow-up TTFT ms":
        followup = result.get("followup")
        return [(f"@{followup['history_tokens']}" if followup else "", followup and followup["ttft_ms"])]
    raise ValueError(check)


def target_checks(result: dict) -> list[dict]:
    """Each target of the result's model: {check, where, value, target, met} (met None: not measured).
    None for a model cut to fewer layers: the targets are for the real shapes."""
    if result.get("layers") is not None:
        return []
    checks = []
    for check, comparison, threshold in TARGETS.get(result["model"], []):
        for where, value in _check_values(result, check):
            met = _COMPARE[comparison](value, threshold) if value is not None else None
            checks.append({"check": check, "where": where, "value": value, "target": f"{comparison} {threshold:g}",
                           "met": met})
    return checks


def _num(value: float | None, fmt: str = ",.1f") -> str:
    return "-" if value is None else format(value, fmt)


def _rows(result: dict) -> list[tuple[str, str]]:
    """(metric, value) lines for one model."""
    bandwidth, weights = result.get("bandwidth_bytes_per_s"), result.get("weight_bytes_per_token")
    rows = [("copy bandwidth, GB/s (read + write)", _num(bandwidth and bandwidth / 1e9)),
            ("weights read per token, MB", _num(weights and weights / 1e6))]
    if result.get("experts_stacked") is not None:  # a mixture: stacked experts (model/moe.py) or the loop form
        rows.append(("mixture's experts", "stacked" if result["experts_stacked"] else "per expert, routes read back"))
    for row in result.get("decode") or []:
        rows.append((f"decode @ {row['context_tokens']} context, tok/s",
                     f"{row['tokens_per_s']:,.1f}  ({_num(row['roofline_fraction'], '.0%')} of roofline)"))
    if result.get("prefill"):
        rows.append((f"cold prefill of {result['prefill']['prompt_tokens']} tokens, tok/s",
                     _num(result["prefill"]["tokens_per_s"])))
    if followup := result.get("followup"):
        rows.append((f"follow-up TTFT, {followup['history_tokens']} cached + {followup['new_tokens']} new, ms",
                     f"{followup['ttft_ms']:,.1f}  ({followup['cached_tokens']} cached / "
                     f"{followup['prefilled_tokens']} prefilled)"))
    if hf := result.get("hf_decode"):
        rows.append((f"transformers generate @ {hf['context_tokens']}, tok/s", _num(hf["tokens_per_s"])))
    if result.get("logits_rel_error") is not None:
        rows.append(("logits vs transformers, max rel error", f"{result['logits_rel_error']:.2e}"))
    if greedy := result.get("greedy_vs_hf"):
        same = "equal" if greedy["equal"] else f"differ from token {greedy['first_difference']}"
        rows.append((f"greedy tokens vs transformers ({greedy['tokens']})", same))
    for config in result.get("configs") or []:
        if config.get("skipped"):
            value = f"skipped: {config['skipped']}"
        else:
            equal = {True: "= eager", False: "!= eager", None: "= eager ?"}[config["greedy_equal_eager"]]
            value = (f"{_num(config['decode_tokens_per_s'])}  ({_num(config.get('roofline_fraction'), '.0%')} of "
                     f"roofline, tokens {equal})")
        path = f" ({config['decode_path']})" if config.get("decode_path") else ""
        rows.append((f"config {config['name']}{path}: decode tok/s", value))
        if batched := config.get("batched"):
            parted = "" if batched["equal"] else f" from token {batched['first_difference']}"
            rows.append((f"config {config['name']}: {batched['requests']} requests batched, greedy",
                         ("= each alone" if batched["equal"] else "!= alone") + parted))
        if spec := config.get("speculative"):
            rows.append((f"config {config['name']}: speculative greedy",
                         f"{'= plain' if spec['equal'] else '!= plain'}  ({spec['tokens_per_step']:.2f} tok/step, "
                         f"{spec['accepted_tokens']}/{spec['draft_tokens']} drafts accepted)"))
    for step, error in (result.get("errors") or {}).items():
        rows.append((f"{'NOT RUN' if error.startswith('skipped') else 'FAILED'} {step}", error[:100]))
    return rows


def format_report(results: list[dict]) -> str:
    """One table: each model's numbers, then every target with its verdict."""
    lines = []
    for result in results:
        depth = f", {result['layers']} layers only" if result.get("layers") is not None else ""
        lines.append(f"{result['model']} (shape of {result['shape_of']}{depth}) · {result['device']} · "
                     f"{result['dtype']}")
        lines += [f"  {metric:52} {value}" for metric, value in _rows(result)]
    checks = [(result["model"], check) for result in results for check in target_checks(result)]
    if checks:
        lines.append("targets")
    for model, check in checks:
        verdict = {True: "MET", False: "MISSED", None: "not measured"}[check["met"]]
        value = _num(check["value"], ".2f")
        lines.append(f"  {model:14} {check['check'] + ' ' + check['where']:36} {value:>9} {check['target']:>8}  "
                     f"{verdict}")
    return "\n".join(lines)
