"""``/usage``: the tokens the model server reported for this conversation, and for the user today and this month,
with their cost where ``model.prices`` has the models' prices."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from zoneinfo import ZoneInfo

from gateway.commands.base import CommandContext, command
from gateway.config.sections import ModelPrice
from gateway.usage import UsageTotals, usage_report

_CENT = Decimal("0.01")
_SMALLEST = Decimal("0.0001")


def format_cost(cost: Decimal) -> str:
    """US dollars: to the cent from a dollar up, below that to at most four decimals (at least two)."""
    if cost >= 1:
        return f"${cost.quantize(_CENT, ROUND_HALF_UP):,}"
    shown = cost.quantize(_SMALLEST, ROUND_HALF_UP)
    if shown == 0 and cost > 0:
        return "<$0.0001"
    decimals = max(2, -shown.normalize().as_tuple().exponent) if shown else 2
    return f"${shown:.{decimals}f}"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _line(label: str, totals: UsageTotals, prices: Mapping[str, ModelPrice]) -> str:
    if not totals.models:
        return f"{label}: nothing yet"
    parts = [f"{totals.prompt_tokens:,} in, {totals.completion_tokens:,} out", _plural(totals.runs, "run")]
    if prices:
        cost, unknown = totals.cost(prices)
        priced = len(unknown) < len(totals.models)
        parts.append(f"{format_cost(cost)} + unknown" if priced and unknown else
                     format_cost(cost) if priced else "cost unknown")
    return f"{label}: " + " · ".join(parts)


@command("usage", "tokens used and their cost: this conversation, you today and this month")
async def _usage(ctx: CommandContext) -> str:
    cfg, e = ctx.host.cfg, ctx.event
    zone = cfg.cron.timezone
    report = await usage_report(ctx.host.store, ctx.session_key, f"{e.platform}:{e.user_id}", datetime.now(UTC),
                                ZoneInfo(zone))
    prices = cfg.model.prices
    lines = [f"Token usage (days in {zone}):",
             _line("This conversation (since /new)", report.conversation, prices),
             _line("You today", report.today, prices),
             _line("You this month", report.month, prices)]
    unpriced = sorted({m.model for m in report.month.models + report.conversation.models} - set(prices))
    if not prices:
        lines.append("Cost: no model prices are configured on this gateway.")
    elif unpriced:
        lines.append(f"Cost unknown (no price configured) for {', '.join(unpriced)}.")
    return "\n".join(lines)
