#!/usr/bin/env python3
"""Pools the runs of one layout over several calls of a device lease (docs/PLANNER.md, the eighth lease).

Calls of scripts/planner-campaign.sh from one calibration (--calibrations) plan and run the same
layouts; this reads each call's case logs (`runs in turn` lines), and prints per layout the
prediction, every run, their median and spread (slowest / fastest), the error against the median,
and per case Kendall's tau of the predictions against the medians and how far the chosen layout's
median lies behind the best median; then the spread and error over all layouts.
Usage: tools/pool_lease_runs.py DIR [DIR...]   (each DIR holds case6.log, case10.log, case11.log)
"""
import itertools, os, re, statistics, sys

MEASURED = re.compile(r'^\s+(\d+)\s+(dp .*?)\s+([\d.]+)s\s+([\d.]+)s\s+([-+][\d.]+)%\s+\S+ GiB\s+\S+ GiB\s+([-+][\d.]+)%')


def tau(p, q):
    s = [((a - b) * (c - d) > 0) - ((a - b) * (c - d) < 0) for (a, c), (b, d) in itertools.combinations(zip(p, q), 2)]
    return sum(s) / len(s)


def main(dirs):
    spreads, errors, mem = [], [], []
    for case in ('case10.log', 'case6.log', 'case11.log'):
        rows = {}
        for d in dirs:
            path = os.path.join(d, case)
            if not os.path.exists(path):
                continue
            lines = open(path).read().splitlines()
            for i, line in enumerate(lines):
                m = MEASURED.match(line)
                if not m:
                    continue
                nxt = lines[i + 1] if i + 1 < len(lines) else ''
                runs = [float(x) for x in nxt.split(':')[1].split()] if 'runs in turn' in nxt else [float(m.group(4))]
                row = rows.setdefault(m.group(2).strip(), [float(m.group(3)), []])
                row[1].extend(runs)
                mem.append(abs(float(m.group(6))))
        if not rows:
            continue
        print(case)
        pred, med = [], []
        for layout, (p, runs) in rows.items():
            md = statistics.median(runs)
            spreads.append(max(runs) / min(runs))
            errors.append(abs(p - md) / md * 100)
            pred.append(p)
            med.append(md)
            print(f'  {layout:62s} predicted {p:.4f} s, {len(runs)} runs {" ".join(f"{r:.3f}" for r in runs)}: '
                  f'median {md:.4f} ({(p - md) / md * 100:+.1f} %), spread {max(runs) / min(runs):.2f}')
        chosen = min(range(len(pred)), key=lambda i: pred[i])
        print(f'  tau {tau(pred, med):.2f}; the chosen layout\'s median {med[chosen] / min(med) * 100 - 100:.1f} % behind the best')
    print(f'{len(errors)} layouts: spread median {statistics.median(spreads):.2f} ({min(spreads):.2f}-{max(spreads):.2f}); '
          f'step error against the medians: median {statistics.median(errors):.1f} %, worst {max(errors):.1f} %; '
          f'memory error worst {max(mem):.1f} % over {len(mem)} rows')


if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
