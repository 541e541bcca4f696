"""How many releases a budget buys: basic composition (pure tables) against zCDP tables.

For each total budget (epsilon, delta), the number of releases of JointExp at a per-release
epsilon (0.1 by default) that a pure table allows (epsilon / epsilon_1) and that a zCDP
table allows: the largest k with dp-accounting's RDP epsilon of k ZCDpEvents of
rho_1 = epsilon_1^2 / 8 at delta not above the total (what the service's rounding allows is
the same or one less; ``tests/service/test_zcdp.py`` checks it through the API).

Usage::

    .venv/bin/python -m benchmarks.zcdp_releases [--epsilon 0.1] [--delta 1e-6]
"""

from __future__ import annotations

import argparse
from decimal import Decimal

from dp_accounting import dp_event, rdp

from app.ledger.zcdp import releases_left, rho_for


def accountant_epsilon(rho: float, delta: float) -> float:
    accountant = rdp.RdpAccountant()
    accountant.compose(dp_event.ZCDpEvent(rho))
    return float(accountant.get_epsilon(delta))


def max_releases(total: float, delta: float, rho_each: float) -> int:
    lo, hi = 0, 1
    while accountant_epsilon(hi * rho_each, delta) <= total:
        hi *= 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if accountant_epsilon(mid * rho_each, delta) <= total else (lo, mid)
    return lo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", default="0.1", help="each release's epsilon")
    parser.add_argument("--delta", default="1e-6", help="the zCDP table's delta")
    parser.add_argument("--totals", default="0.5,1,3,10,30")
    args = parser.parse_args()
    each = Decimal(args.epsilon)
    delta = Decimal(args.delta)
    rho_each = each * each / 8
    print(f"JointExp releases at epsilon {each}; zCDP at delta {delta} (rho {rho_each} each)")
    print(
        "| total epsilon | pure (basic composition) | zCDP (accountant) | zCDP (service) | ratio |"
    )
    print("|---|---|---|---|---|")
    for text in args.totals.split(","):
        total = Decimal(text)
        pure = int(total // each)
        exact = max_releases(float(total), float(delta), float(rho_each))
        service = releases_left(rho_for(total, delta), rho_each) or 0
        ratio = f"{exact / pure:.1f}x" if pure else "-"
        print(f"| {total} | {pure:,} | {exact:,} | {service:,} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
