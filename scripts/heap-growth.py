#!/usr/bin/env python3
"""What a heaptrack recording holds live over time, and what grew between two instants.

    python3 scripts/heap-growth.py FILE.zst                 # live heap every 60 s, and the peak
    python3 scripts/heap-growth.py FILE.zst T1 T2 [DEPTH]   # the growth from T1 to T2 (seconds),
                                                            # by call stack and by allocation size

heaptrack_print sums a whole run (or its peak); a slow growth under churn needs the live heap
at two instants. This replays the recording's allocations and frees (heaptrack's interpreted
format: `a` allocation info, `+`/`-` an allocation or free of one, `c` a timestamp in ms,
`t`/`i`/`s` the traces, frames and strings, numbers in hex). Stacks are cut to their DEPTH
(default 3) innermost frames of this project, kube, k8s-openapi, hyper or tokio; allocation
sizes count objects that keep one size (a BTreeMap leaf, a Vec of a given capacity).
Reads the whole file once (a 30 MB recording takes one to two minutes). Needs `zstd`.
"""
import collections
import re
import subprocess
import sys

KEEP = re.compile(r"tidepool|kube|k8s|hyper|tokio")
LIBRARY = re.compile(r"^(_?\$LT\$)?(alloc|core|std|hashbrown)(::|\.\.)|^__rust|CountingAllocator")


def replay(path, instants):
    """The recording's allocation infos (size, trace), its traces and strings, and the live
    count of each allocation info at each of `instants` (ms; the end if past it)."""
    out = subprocess.Popen(["zstd", "-dc", path], stdout=subprocess.PIPE, text=True, bufsize=1 << 20)
    strings, frames, traces, infos = [None], [None], [(0, 0)], []
    live = collections.Counter()
    snaps, series, now, total, peak, next_print = {}, [], 0, 0, (0, 0), 0
    for line in out.stdout:
        tag = line[0]
        if tag == "+":
            i = int(line[2:], 16)
            live[i] += 1
            total += infos[i][0]
        elif tag == "-":
            i = int(line[2:], 16)
            live[i] -= 1
            total -= infos[i][0]
        elif tag == "c":
            now = int(line[2:], 16)
            peak = max(peak, (total, now))
            if now >= next_print:
                series.append((now, total))
                next_print = now + 60_000
            for t in instants:
                if t not in snaps and now >= t:
                    snaps[t] = (now, collections.Counter(live))
        elif tag == "a":
            size, trace = line.split()[1:3]
            infos.append((int(size, 16), int(trace, 16)))
        elif tag == "t":
            frame, parent = line.split()[1:3]
            traces.append((int(frame, 16), int(parent, 16)))
        elif tag == "i":
            parts = line.split()
            frames.append(int(parts[3], 16) if len(parts) > 3 else 0)
        elif tag == "s":
            text = line.rstrip("\n")[2:]
            strings.append(text.split(" ", 1)[1] if " " in text else "")
    for t in instants:
        snaps.setdefault(t, (now, collections.Counter(live)))
    return infos, traces, frames, strings, snaps, series, peak


def stack(trace, traces, frames, strings, depth):
    names = []
    while trace and len(names) < depth:
        frame, trace = traces[trace][0], traces[trace][1]
        name = strings[frames[frame]] if frames[frame] else "?"
        name = re.sub(r"::h[0-9a-f]{16}$", "", name)
        if KEEP.search(name) and not LIBRARY.search(name):
            names.append(name)
    return " <- ".join(names) or "?"


def main():
    path = sys.argv[1]
    if len(sys.argv) < 4:
        _, _, _, _, _, series, peak = replay(path, [])
        for t, b in series:
            print(f"{t / 1000:7.0f} s {b / 1e6:8.1f} MB")
        print(f"peak {peak[0] / 1e6:.1f} MB at {peak[1] / 1000:.1f} s")
        return
    t1, t2 = (float(a) * 1000 for a in sys.argv[2:4])
    depth = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    infos, traces, frames, strings, snaps, _, _ = replay(path, [t1, t2])
    (at1, a), (at2, b) = snaps[t1], snaps[t2]
    by_stack, by_size = collections.Counter(), collections.Counter()
    held = [0, 0]
    for i, (size, trace) in enumerate(infos):
        held[0] += a[i] * size
        held[1] += b[i] * size
        if a[i] != b[i]:
            by_stack[stack(trace, traces, frames, strings, depth)] += (b[i] - a[i]) * size
            by_size[size] += b[i] - a[i]
    print(f"live at {at1 / 1000:.0f} s: {held[0] / 1e6:.2f} MB; at {at2 / 1000:.0f} s: "
          f"{held[1] / 1e6:.2f} MB; growth {(held[1] - held[0]) / 1e6:+.2f} MB")
    print("by call stack (MB):")
    for name, grew in sorted(by_stack.items(), key=lambda kv: -abs(kv[1]))[:20]:
        print(f"  {grew / 1e6:+8.3f}  {name[:300]}")
    print("by allocation size (bytes: objects more or fewer, MB):")
    for size, n in sorted(by_size.items(), key=lambda kv: -abs(kv[0] * kv[1]))[:12]:
        print(f"  {size:9d}: {n:+7d}  {size * n / 1e6:+.3f}")


if __name__ == "__main__":
    main()
