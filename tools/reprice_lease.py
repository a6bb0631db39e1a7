#!/usr/bin/env python3
"""Re-prices a device lease's planner validations offline (docs/PLANNER.md, the sixth lease).

Reads a lease folder (docs/leases/DATE: c4.json, c8.json and the case logs that
scripts/planner-campaign.sh wrote), predicts every measured layout again with `meshtrain plan
--search` from the same calibration, as it is and with each dtype's and direction's in-situ factors
set to the two architectures' mean where they lie more than 25 % apart, and, where the lease has
them (planner-campaign.sh --pace-ab), from the calibrations taken with --pace (c4.pace.json); it
prints each case's step errors against the measured medians, Kendall's tau and the chosen layout.
Usage: tools/reprice_lease.py [LEASE_DIR (docs/leases/2026-11-28)] [--meshtrain build/ci/meshtrain]
"""
import argparse, itertools, json, os, re, statistics, subprocess, tempfile

CASES = {  # log: config, ranks, calibration, the case's own arguments (scripts/planner-campaign.sh)
    'case10.log': ('plan-llama-mid.json', 4, 'c4.json', ['--memory', '0.2', '--set', 'train_micro_batch_size_per_gpu=2']),
    'case10a.log': ('plan-llama-mid.json', 4, 'c4.json', ['--memory', '0.2', '--set', 'train_micro_batch_size_per_gpu=2']),
    'case6.log': ('plan-gpt2-mid.json', 4, 'c4.json', ['--set', 'train_micro_batch_size_per_gpu=2']),
    'case11.log': ('plan-gpt2-mid.json', 8, 'c8.json', ['--set', 'train_micro_batch_size_per_gpu=1']),
    'case10b.log': ('plan-llama-mid.json', 4, 'c4.json', ['--memory', '0.2', '--set', 'train_micro_batch_size_per_gpu=2']),
}
MEASURED = re.compile(r'^\s+(\d+)\s+(.*?)\s+([\d.]+)s\s+([\d.]+)s\s+([-+][\d.]+)%')
RANKED = re.compile(r'^\s+(\d+)\s+(dp .*?)\s{2,}([\d.]+)\s+\d+\s')


def pooled(cal):
    d = json.load(open(cal))
    f = d['fits']
    for dt in ('f32', 'bf16'):
        for way in ('forward', 'backward'):
            g, l = f'in situ {way} gpt2 {dt}', f'in situ {way} llama {dt}'
            a, b = f[g]['per_unit_s'], f[l]['per_unit_s']
            if max(a, b) / min(a, b) > 1.25:
                f[g]['per_unit_s'] = f[l]['per_unit_s'] = (a + b) / 2
    return d


def tau(p, q):
    s = [((a - b) * (c - d) > 0) - ((a - b) * (c - d) < 0) for (a, c), (b, d) in itertools.combinations(zip(p, q), 2)]
    return sum(s) / len(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('lease', nargs='?', default='docs/leases/2026-11-28')
    ap.add_argument('--meshtrain', default='build/ci/meshtrain')
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    hows = ['as calibrated', 'one factor for both architectures']
    if any(os.path.exists(os.path.join(a.lease, f'c{n}.pace.json')) for n in (4, 8)):
        hows.append('calibrated with --pace')
    for how in hows:
        every = []
        for log, (cfg, procs, cal, extra) in CASES.items():
            path = os.path.join(a.lease, log)
            if how == 'calibrated with --pace':
                cal = cal.replace('.json', '.pace.json')
            if not os.path.exists(path) or not os.path.exists(os.path.join(a.lease, cal)):
                continue
            measured = {m.group(2).strip(): float(m.group(4)) for m in map(MEASURED.match, open(path)) if m}
            cal_path = os.path.join(a.lease, cal)
            if how == 'one factor for both architectures':
                cal_path = os.path.join(tmp, cal)
                json.dump(pooled(os.path.join(a.lease, cal)), open(cal_path, 'w'))
            out = subprocess.run([a.meshtrain, 'plan', os.path.join('configs', cfg), '--procs', str(procs), '--calibration',
                                  cal_path, '--search', '--top', '5000', '--set', 'train_batch_size=8'] + extra,
                                 capture_output=True, text=True, check=True).stdout
            predicted = {m.group(2).strip(): float(m.group(3)) for m in map(RANKED.match, out.splitlines()) if m}
            rows = [(predicted[k], v) for k, v in measured.items() if k in predicted]
            missing = [k for k in measured if k not in predicted]
            errs = [(p - m) / m * 100 for p, m in rows]
            chosen = min((k for k in measured if k in predicted), key=predicted.get)
            over = (measured[chosen] / min(measured.values()) - 1) * 100
            every += [abs(e) for e in errs]
            print(f"{how:34s} {log:12s} errors {' '.join(f'{e:+.1f}' for e in errs)}  median {statistics.median(map(abs, errs)):.1f} %"
                  f"  worst {max(map(abs, errs)):.1f} %  tau {tau(*zip(*rows)):.2f}  chosen {over:.1f} % behind the best"
                  + (f"  (not ranked: {missing})" if missing else ''))
        if every:
            print(f"{how:34s} all {len(every)} rows: median {statistics.median(every):.1f} %, worst {max(every):.1f} %")


if __name__ == '__main__':
    main()
