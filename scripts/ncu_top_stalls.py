"""The SASS lines of an Nsight Compute source page (`ncu -i REP --page source --print-source
sass --csv`) with the most warp-stall samples, and their share of all samples.

    python3 scripts/ncu_top_stalls.py SASS.csv [N]
"""
import csv
import sys


def main() -> int:
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f)]
    head = next(i for i, r in enumerate(rows) if "Source" in r and "Address" in r)
    cols = rows[head]
    src, samples = cols.index("Source"), cols.index("Warp Stall Sampling (All Samples)")
    body = [r for r in rows[head + 1:] if len(r) > samples and r[samples].strip()]

    def count(r):
        try:
            return float(r[samples].replace(",", ""))
        except ValueError:
            return 0.0
    total = sum(count(r) for r in body) or 1.0
    print(f"{len(body)} SASS lines, {total:.0f} stall samples")
    for i, r in enumerate(body):
        r.append(str(i))
    for r in sorted(body, key=count, reverse=True)[:n]:
        print(f"{100 * count(r) / total:5.1f}%  #{r[-1]:>4}  {r[src].strip()[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
