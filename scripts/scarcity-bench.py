#!/usr/bin/env python3
# The scarcity table of BENCHMARKS.md: each case with scarcity handling on and off, seeds 1..20.
# Usage: python3 scripts/scarcity-bench.py target/release/tidepool-operator  (from the repository root)
import json, subprocess, sys
B = sys.argv[1]
cases = [
  ("issue's /22 burst (no churn)", ["--source","cluster-pool","--pool-cidr","10.0.0.0/22","--block-size","28","--nodes","30","--pods-per-node","30","--churn","0","--node-churn","0","--crash-rate","0","--duration","30m"]),
  ("scarcity.yaml, cluster-pool /28", ["--source","cluster-pool","--pool-cidr","10.0.0.0/22","--scenario","scenarios/scarcity.yaml"]),
  ("scarcity.yaml, cluster-pool /32", ["--source","cluster-pool","--pool-cidr","10.0.0.0/22","--block-size","32","--scenario","scenarios/scarcity.yaml"]),
  ("scarcity.yaml, cluster-pool IPv6 /124", ["--source","cluster-pool","--pool-cidr","fd00::/118","--block-size-v6","124","--scenario","scenarios/scarcity.yaml"]),
  ("scarcity.yaml, sim-cloud /22 subnet", ["--source","sim-cloud","--subnet-size","22","--scenario","scenarios/scarcity.yaml"]),
  ("scarcity-pools.yaml, several pools", ["--source","cluster-pool","--pool-cidr","10.0.0.0/14","--scenario","scenarios/scarcity-pools.yaml"]),
]
print("| case | handling | pods never served | waiting s (sum) | oracle s (sum) | within 1.2×oracle+60 s/episode | oracle above the waiting | promise breaches (pods) | source calls |")
print("|---|---|---|---|---|---|---|---|---|")
for name, args in cases:
    for on in ["true","false"]:
        out = subprocess.run([B,"simulate",*args,"--seeds","1..20","--scarcity-handling="+on,"--report","json"],capture_output=True,text=True).stdout
        r = json.loads(out)
        runs = [x["report"] for x in r["runs"]]
        never = sum(x["pods"]["never_served"] for x in runs)
        wait = sum(x["scarcity"]["wait_seconds"] for x in runs)
        orc = sum(x["scarcity"]["oracle_wait_seconds"] for x in runs)
        ok = sum(1 for x in runs if x["scarcity"]["wait_seconds"] <= 1.2*x["scarcity"]["oracle_wait_seconds"] + 60*max(1,x["scarcity"]["episodes"]))
        above = sum(1 for x in runs if x["scarcity"]["oracle_wait_seconds"] > x["scarcity"]["wait_seconds"] + 1e-6)
        br = sum(x["scarcity"]["idle_while_waiting"]["pods"] for x in runs)
        calls = sum(x["api"]["source_calls"] for x in runs)
        inv = sum(1 for x in runs if not all(v==0 for v in x["invariants"].values()))
        print(f"| {name} | {'on' if on=='true' else 'off'} | {never} | {wait:.0f} | {orc:.0f} | {ok}/20 | {above}/20 | {br} | {calls} |" + (f" INVARIANTS {inv}" if inv else ""))
