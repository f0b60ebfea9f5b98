#!/usr/bin/env python3
"""What speculative decoding chose and what its steps took, step by step, summarised.

Reads the stderr of an engine run with DSINFER_SPEC_TRACE=1 (e.g. `dsinfer bench --speculative
fixed:2,auto ...`), whose lines are

  [bench speculative] auto: starting the engine...
  [spec-trace] step 12: 3 drafting, depth 2 | 1:2 2:2 4:1x
  [spec-trace] step 12: 3 at depth 2 took 1.234 ms, emitted 7, predicted 1.200
  [spec-trace] step 13: 3 at depth 2 took 4.321 ms, emitted 6, not recorded (2 shape warm-ups)
  [spec-trace] step 14: 3 at depth 2 took 1.100 ms, emitted 8, fixed

(auto's drafting lines end in `| a 0.91 0.80 | rate -1:900 1:1500 2:1700`: its predicted
acceptance per draft position and emitted tokens per second per depth; `emitted`: the tokens the
speculating requests emitted that step)

(`fixed`: a fixed mode's step, timed the same way), and prints, per mode (from the bench's
"starting the engine" lines; `-` without them) and batch size: how many steps ran at each depth,
how many were measured (not first runs of a shape), the median and mean measured step time
against auto's mean prediction, the mean drafts each request verified, the measured emitted
tokens per second against auto's predicted rate for that depth, and the runs of
consecutive depths (e.g. `3x40 2x5 3x120`), so that a run where auto settles on a depth the
fixed modes beat shows whether it mispredicts the step time, explores, never tries the better
depth, or runs the same depth's steps slower than the fixed mode does; then per mode the steps,
measured steps, shape warm-ups and (batch, depth) pairs over every batch size.

Usage: tools/bench/spec_trace.py LOG [--last N]
       tools/bench/spec_trace.py --self-test
"""
import argparse
import collections
import re
import statistics
import sys

DRAFT_RE = re.compile(r"\[spec-trace\] step (\d+): (\d+) drafting, depth (-?\d+) \|(.*)$")
TIME_RE = re.compile(
    r"\[spec-trace\] step (\d+): (\d+) at depth (-?\d+) took ([0-9.]+) ms, "
    r"(?:emitted (\d+), )?(?:predicted ([0-9.]+)|(not recorded)|fixed)")
MODE_RE = re.compile(r"\[bench speculative\] (\S+): starting the engine")
# An interleaved bench (--interleave-modes) starts every engine first and then runs the modes in
# turn; each run ends in its round line, which names the mode of the steps before it.
ROUND_RE = re.compile(r"\[bench speculative\] round \d+ batch \d+ (\S+): ")


def attribute(lines):
  """-> [(mode, line)]: each trace line with its mode: before the first round line (an engine's
  start-up and warm-up) the latest "starting the engine" line's, after it the mode of the round
  line that ends the run."""
  out, pending, mode, rounds = [], [], "-", False
  for line in lines:
    m = MODE_RE.search(line)
    if m:
      out.extend((mode, l) for l in pending)
      pending, mode = [], m.group(1)
      out.append((mode, line))
      continue
    m = ROUND_RE.search(line)
    if m:
      out.extend((m.group(1) if rounds else mode, l) for l in pending)
      pending, rounds = [], True
      continue
    pending.append(line)
  out.extend((mode, l) for l in pending)
  return out


class Depth:
  def __init__(self):
    self.steps = 0
    self.took = []  # measured steps only (not a shape's first runs)
    self.warmups = 0
    self.predicted = []
    self.verified = []  # drafts per request
    self.emitted = 0  # tokens emitted by the measured steps (speculating requests)
    self.emitted_ms = 0.0  # their time
    self.pred_rate = []  # auto's predicted tok/s for this depth, at the steps that ran it


def parse(lines):
  """-> {(mode, batch): {depth: Depth}}, {(mode, batch): [depth per step in order]}."""
  by_batch = collections.defaultdict(lambda: collections.defaultdict(Depth))
  order = collections.defaultdict(list)
  drafting = {}  # step -> (batch, depth, [k per request], {depth: predicted tok/s})
  for mode, line in attribute(lines):
    m = MODE_RE.search(line)
    if m:
      drafting = {}
      continue
    m = DRAFT_RE.search(line)
    if m:
      parts = m.group(4).split("|")
      ks = []
      for tok in parts[0].split():
        k = tok.split(":", 1)[1].rstrip("x")
        ks.append(int(k))
      rates = {}
      for part in parts[1:]:
        words = part.split()
        if words and words[0] == "rate":
          for w in words[1:]:
            d, r = w.split(":")
            rates[int(d)] = float(r)
      drafting[int(m.group(1))] = (int(m.group(2)), int(m.group(3)), ks, rates)
      continue
    m = TIME_RE.search(line)
    if not m:
      continue
    step, b, d = int(m.group(1)), (mode, int(m.group(2))), int(m.group(3))
    rec = by_batch[b][d]
    rec.steps += 1
    order[b].append(d)
    if m.group(7) is not None:
      rec.warmups += 1
    else:
      rec.took.append(float(m.group(4)))
      if m.group(6) is not None:
        rec.predicted.append(float(m.group(6)))
      if m.group(5) is not None:
        # (Speculation-free steps count one token per request.)
        rec.emitted += int(m.group(5)) if d >= 1 else int(m.group(2))
        rec.emitted_ms += float(m.group(4))
    if step in drafting:
      info = drafting.pop(step)
      rec.verified.extend(info[2])
      if d in info[3] and m.group(7) is None:
        rec.pred_rate.append(info[3][d])
  return by_batch, order


def runs(seq):
  out = []
  for d in seq:
    if out and out[-1][0] == d:
      out[-1][1] += 1
    else:
      out.append([d, 1])
  return " ".join(f"{d}x{n}" for d, n in out)


def report(by_batch, order, last):
  lines = []
  for b in sorted(by_batch, key=lambda k: (k[1], k[0])):
    lines.append(f"batch {b[1]} ({b[0]}): {len(order[b])} steps")
    lines.append("  depth  steps  measured  warm-ups  median ms  mean ms  predicted ms  "
                 "drafts/request  tok/s  predicted tok/s")
    for d in sorted(by_batch[b]):
      r = by_batch[b][d]
      med = f"{statistics.median(r.took):.3f}" if r.took else "-"
      mean = f"{statistics.fmean(r.took):.3f}" if r.took else "-"
      pred = f"{statistics.fmean(r.predicted):.3f}" if r.predicted else "-"
      ver = f"{statistics.fmean(r.verified):.2f}" if r.verified else "-"
      rate = f"{r.emitted / r.emitted_ms * 1e3:.0f}" if r.emitted_ms > 0 else "-"
      prate = f"{statistics.fmean(r.pred_rate):.0f}" if r.pred_rate else "-"
      lines.append(f"  {d:>5}  {r.steps:>5}  {len(r.took):>8}  {r.warmups:>8}  {med:>9}  "
                   f"{mean:>7}  {pred:>12}  {ver:>14}  {rate:>5}  {prate:>15}")
    seq = order[b][-last:] if last > 0 else order[b]
    lines.append(f"  depth runs{' (last %d steps)' % last if last > 0 else ''}: {runs(seq)}")
  lines.extend(totals(by_batch))
  return "\n".join(lines)


def totals(by_batch):
  """Per mode over every batch size: steps, measured steps, shape warm-ups (first runs of a
  (batch, depth) shape, not measured) and the (batch, depth) pairs run: a mode that visits more
  shapes pays more warm-ups (auto against a fixed depth)."""
  acc = collections.defaultdict(lambda: [0, 0, 0, 0])
  for (mode, _), depths in by_batch.items():
    t = acc[mode]
    for r in depths.values():
      t[0] += r.steps
      t[1] += len(r.took)
      t[2] += r.warmups
      t[3] += 1
  out = ["per mode: steps  measured  warm-ups  (batch, depth) pairs"]
  for mode in sorted(acc):
    t = acc[mode]
    out.append(f"  {mode:<10} {t[0]:>6}  {t[1]:>8}  {t[2]:>8}  {t[3]:>6}")
  return out


def self_test():
  log = """\
[bench speculative] fixed:2: starting the engine...
[spec-trace] step 3: 2 drafting, depth 0 | 1:2 2:2
[spec-trace] step 3: 2 at depth 2 took 1.500 ms, fixed
[bench speculative] auto: starting the engine...
[bench speculative] round 1 batch 64 auto: 1.0 tokens/s
[spec-trace] step 10: 2 drafting, depth 3 | 1:3 2:2x
[spec-trace] step 10: 2 at depth 3 took 4.000 ms, not recorded (2 shape warm-ups)
[spec-trace] step 11: 2 drafting, depth 3 | 1:3 2:3 | a 0.900 0.800 0.700 | rate -1:800 1:1200 2:1400 3:1500
[spec-trace] step 11: 2 at depth 3 took 3.000 ms, emitted 6, predicted 2.500
[spec-trace] step 12: 2 drafting, depth 3 | 1:3 2:3
[spec-trace] step 12: 2 at depth 3 took 5.000 ms, predicted 2.700
[spec-trace] step 13: 2 drafting, depth 2 | 1:2 2:1
[spec-trace] step 13: 2 at depth 2 took 2.000 ms, predicted 2.100
[spec-trace] step 14: 1 at depth -1 took 1.000 ms, predicted 1.100
"""
  inter = """\
[bench speculative] fixed:2: starting the engine...
[bench speculative] auto: starting the engine...
[spec-trace] step 0: 2 at depth 4 took 3.000 ms, emitted 9, predicted 3.100
[bench speculative] round 1 batch 2 off: 9.0 tokens/s
[spec-trace] step 1: 2 at depth 2 took 1.000 ms, emitted 5, fixed
[bench speculative] round 1 batch 2 fixed:2: 9.0 tokens/s
[spec-trace] step 2: 2 at depth 3 took 2.000 ms, emitted 7, predicted 2.100
[bench speculative] round 1 batch 2 auto: 9.0 tokens/s
"""
  ib, _ = parse(inter.splitlines())
  assert sorted(ib) == [("auto", 2), ("fixed:2", 2)], sorted(ib)
  assert ib[("fixed:2", 2)][2].took == [1.0] and ib[("auto", 2)][3].took == [2.0]
  assert ib[("auto", 2)][4].took == [3.0]  # auto's start-up, before the first round
  by_batch, order = parse(log.splitlines())
  assert sorted(by_batch) == [("auto", 1), ("auto", 2), ("fixed:2", 2)], sorted(by_batch)
  f2 = by_batch[("fixed:2", 2)][2]
  assert (f2.steps, f2.took, f2.predicted, f2.verified) == (1, [1.5], [], [2, 2]), vars(f2)
  d3 = by_batch[("auto", 2)][3]
  assert (d3.steps, len(d3.took), d3.warmups) == (3, 2, 1), vars(d3)
  assert d3.took == [3.0, 5.0] and d3.predicted == [2.5, 2.7]
  assert (d3.emitted, d3.emitted_ms, d3.pred_rate) == (6, 3.0, [1500.0]), vars(d3)
  assert d3.verified == [3, 2, 3, 3, 3, 3], d3.verified
  assert by_batch[("auto", 2)][2].verified == [2, 1]
  assert order[("auto", 2)] == [3, 3, 3, 2] and runs(order[("auto", 2)]) == "3x3 2x1"
  assert by_batch[("auto", 1)][-1].took == [1.0] and by_batch[("auto", 1)][-1].verified == []
  text = report(by_batch, order, 0)
  assert "batch 2 (auto): 4 steps" in text and "4.000" in text and "3x3 2x1" in text, text
  assert "batch 2 (fixed:2): 1 steps" in text and "1.500" in text, text
  assert "depth runs (last 1 steps): 2x1" in report(by_batch, order, 1)
  # auto: 5 steps (4 at batch 2, 1 at batch 1), 4 measured, 1 warm-up, 3 (batch, depth) pairs.
  tot = totals(by_batch)
  assert any(l.split() == ["auto", "5", "4", "1", "3"] for l in tot), tot
  assert any(l.split() == ["fixed:2", "1", "1", "0", "1"] for l in tot), tot
  assert parse(["nothing to see"]) == ({}, {})
  print("spec_trace self-test passed")


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("log", nargs="?")
  ap.add_argument("--last", type=int, default=0, help="depth runs of the last N steps only")
  ap.add_argument("--self-test", action="store_true")
  a = ap.parse_args()
  if a.self_test:
    self_test()
    return 0
  if not a.log:
    ap.error("a log file is needed (or --self-test)")
  with open(a.log, errors="replace") as f:
    by_batch, order = parse(f)
  if not by_batch:
    print(f"{a.log}: no [spec-trace] step times (run with DSINFER_SPEC_TRACE=1 and auto)",
          file=sys.stderr)
    return 1
  print(report(by_batch, order, a.last))
  return 0


if __name__ == "__main__":
  sys.exit(main())
