"""Tests of scripts/nothing-slower-table.py and scripts/bench-nothing-slower.sh (run by `make test`:
python3 -m unittest discover -s scripts/tests).

The table script is loaded as a module and fed documents shaped like `bench paper`'s JSON; the
bench script is run for real, as root as in CI, with BIN set to a stand-in for `farcache` that
writes such a document per pair (its steal taken from a list) and records its arguments.
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(SCRIPTS, "nothing-slower-table.py")
BENCH = os.path.join(SCRIPTS, "bench-nothing-slower.sh")

spec = importlib.util.spec_from_file_location("table", TABLE)
table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table)


def disk(steal, cpu=700.0):
    return {"steal_ticks": int(steal * 1000), "cpu_ticks": 1000, "check_before_us": 50.0, "check_after_us": 50.0,
            "cpu_check_before_us": cpu, "cpu_check_after_us": cpu}


def doc(pt_secs, fc_secs, pt_steal=0.0, fc_steal=0.0, pt_cpu=700.0, fc_cpu=700.0):
    """A seqread 256 MiB pair on the raw profile, one pass each."""
    run = lambda cfg, secs, steal, cpu: {"experiment": "seqread", "size_bytes": 256 << 20, "config": cfg,
                                         "passes": [{"pass": 1, "secs": secs, "disk": disk(steal, cpu)}]}
    return {"complete": True, "options": {"profile": "raw", "link_rate": "1gbit"},
            "runs": [run("passthrough", pt_secs, pt_steal, pt_cpu), run("farcache", fc_secs, fc_steal, fc_cpu)]}


class Cell(unittest.TestCase):
    def test_a_disturbed_pair_is_set_aside_and_shown(self):
        # Three pairs: 0.50 under 30% steal, 1.00 and 1.10 clean. The median of all three is
        # 1.00; of the clean two the lower middle, 1.00 — and the 0.50 is still shown.
        rows = [(0.5, 0.97, "", True), (1.1, 0.97, "", False), (1.0, 0.97, "", False)]
        got = table.cell(rows)
        self.assertTrue(got.startswith("1.00 (median of 2 undisturbed: 1.00–1.10; all 3: 1.00, 0.50–1.10)"), got)

    def test_the_median_moves_when_the_stolen_pair_was_the_middle(self):
        rows = [(0.8, 0.97, "", False), (0.9, 0.97, "", True), (1.2, 0.97, "", False), (1.3, 0.97, "", False)]
        got = table.cell(rows)
        # Clean: 0.8, 1.2, 1.3 -> 1.2; all four: lower middle 0.9.
        self.assertTrue(got.startswith("1.20 (median of 3 undisturbed"), got)
        self.assertIn("all 4: 0.90, 0.80–1.30", got)

    def test_every_pair_disturbed_falls_back_to_all_of_them(self):
        rows = [(0.9, 0.97, " ¶20%", True), (1.0, 0.97, " ¶9%", True), (0.7, 0.97, " ¶30%", True)]
        self.assertEqual(table.cell(rows), "**0.90** ¶20% (median of 3: 0.70–1.00)")

    def test_one_clean_pair_is_named_as_one(self):
        rows = [(0.6, 1.0, "", True), (1.05, 1.0, "", False)]
        self.assertEqual(table.cell(rows), "1.05 (the one undisturbed pair; all 2: 0.60, 0.60–1.05)")

    def test_a_miss_is_bold_and_never_rounded_up_to_its_target(self):
        self.assertEqual(table.cell([(0.968, 0.97, "", False)]), "**0.968**")

    def test_steal_of_every_measurement_counts(self):
        d = doc(1.0, 1.0)
        d["pgbench"] = [{"disk": disk(0.07)}]
        self.assertAlmostEqual(table.disturbed(d)[0], 0.07)
        d["tpch"] = [{"power_phase": {"disk": disk(0.12)}, "throughput_phase": {}}]
        self.assertAlmostEqual(table.disturbed(d)[0], 0.12)
        self.assertEqual(table.disturbed({"runs": []}), (0.0, 1.0))

    def test_cpu_checks_apart_between_or_within_measurements_count(self):
        self.assertAlmostEqual(table.disturbed(doc(1, 1, pt_cpu=700.0, fc_cpu=910.0))[1], 1.3)
        d = doc(1, 1)
        d["pgbench"] = [{"mode": "tpc-b", "clients": 4, "disk": dict(disk(0.0), cpu_check_after_us=1050.0)}]
        self.assertAlmostEqual(table.disturbed(d)[1], 1.5)
        # tpch: the power (or throughput) tests of the two configurations, as the table's ratio.
        d = doc(1, 1)
        d["tpch"] = [{"config": c, "power_phase": {"disk": disk(0.0, cpu)}} for c, cpu in (("passthrough", 700.0), ("farcache", 840.0))]
        self.assertAlmostEqual(table.disturbed(d)[1], 1.2)
        # Documents from before the check: nothing to judge by.
        old = doc(1, 1)
        for r in old["runs"]:
            for p in r["passes"]:
                del p["disk"]["cpu_check_before_us"], p["disk"]["cpu_check_after_us"]
        self.assertEqual(table.disturbed(old)[1], 1.0)

    def test_the_tpch_load_test_is_marked_and_counted_like_the_queries(self):
        # A host slowed under farcache's load test (CPU checks 1.8x apart, 11% stolen) while
        # the queries ran clean: the load ratio carries the marks, and the pair is disturbed.
        tp = lambda cfg, load_disk: {"config": cfg, "load_secs": 100.0, "power_secs": 100.0, "queries_per_hour": 100.0,
                                     "load": {"secs": 100.0, "disk": load_disk},
                                     "power_phase": {"secs": 100.0, "disk": disk(0.0)},
                                     "throughput_phase": {"secs": 100.0, "disk": disk(0.0)}}
        d = {"options": {"profile": "cloud", "link_rate": "1gbit"},
             "tpch": [tp("passthrough", disk(0.0)), tp("farcache", disk(0.11, 1260.0))]}
        rows = {r[0]: r for r in table.ratios(d)}
        self.assertIn("◊1.8×", rows["tpch load test"][3])
        self.assertIn("¶11%", rows["tpch load test"][3])
        self.assertTrue(rows["tpch load test"][4])
        self.assertEqual(rows["tpch power test"][3], "")
        self.assertFalse(rows["tpch power test"][4])
        self.assertAlmostEqual(table.disturbed(d)[0], 0.11)
        self.assertAlmostEqual(table.disturbed(d)[1], 1.8)

    def test_rows_say_whether_the_pair_was_disturbed(self):
        rows = table.ratios(doc(2.0, 1.0, pt_steal=0.04, fc_steal=0.08))
        self.assertEqual([(r[0], round(r[1], 2), r[4]) for r in rows], [("seqread 256MiB pass 1", 2.0, True)])
        self.assertIn("¶8%", rows[0][3])
        rows = table.ratios(doc(2.0, 1.0, pt_cpu=700.0, fc_cpu=900.0))
        self.assertTrue(rows[0][4])
        self.assertIn("◊1.3×", rows[0][3])
        rows = table.ratios(doc(2.0, 1.0, pt_steal=0.04, pt_cpu=700.0, fc_cpu=800.0))
        self.assertFalse(rows[0][4], rows[0])
        self.assertEqual(rows[0][3], "")


class Disturbed(unittest.TestCase):
    def run_table(self, *docs):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for i, x in enumerate(docs):
                paths.append(os.path.join(d, f"{i}.json"))
                with open(paths[-1], "w") as f:
                    json.dump(x, f)
            return subprocess.run([sys.executable, TABLE, "--disturbed", *paths], capture_output=True, text=True)

    def test_exit_status_says_whether_a_pair_was_disturbed(self):
        self.assertEqual(self.run_table(doc(1, 1, 0.0, 0.05)).returncode, 1)
        r = self.run_table(doc(1, 1, 0.0, 0.051))
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("5.1%", r.stdout)
        r = self.run_table(doc(1, 1, pt_cpu=700.0, fc_cpu=850.0))
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("1.21×", r.stdout)

    def test_an_unreadable_document_is_an_error_not_a_verdict(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            f.write("{not json")
            f.flush()
            r = subprocess.run([sys.executable, TABLE, "--disturbed", f.name], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot read", r.stderr)


class Pooled(unittest.TestCase):
    def runs(self, d, *runs):
        """Result directories under `d`, one per run, each with the pairs (passthrough s,
        farcache s) given for it as raw-seqread/rep<K>/; returns their paths."""
        roots = []
        for i, pairs in enumerate(runs):
            roots.append(os.path.join(d, f"run{i}"))
            for k, (pt, fc) in enumerate(pairs, 1):
                rep = os.path.join(roots[-1], "raw-seqread", f"rep{k}")
                os.makedirs(rep)
                with open(os.path.join(rep, "paper-raw.json"), "w") as f:
                    json.dump(doc(pt, fc), f)
        return roots

    def test_pairs_of_every_run_are_pooled_per_cell(self):
        with tempfile.TemporaryDirectory() as d:
            # Ratios (passthrough ÷ farcache): 0.90, 0.95, 1.10 in one run; 0.96, 0.80 in the other.
            roots = self.runs(d, [(0.9, 1.0), (0.95, 1.0), (1.1, 1.0)], [(0.96, 1.0), (0.8, 1.0)])
            r = subprocess.run([sys.executable, TABLE, "--pooled", *roots], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        row = [line for line in r.stdout.splitlines() if line.startswith("| seqread 256MiB pass 1 |")]
        self.assertEqual(len(row), 1, r.stdout)
        cols = [c.strip() for c in row[0].strip("|").split("|")]
        # disk, pairs, median (the lower middle, as the table's), geometric mean, below target,
        # below / above 1, sign test (4 below and 1 above of 5: 2 * 6/32).
        self.assertEqual(cols[1:], ["raw", "5", "0.950", f"{(0.9 * 0.95 * 1.1 * 0.96 * 0.8) ** 0.2:.3f}", "4 of 5", "4 / 1", "0.38"])

    def test_the_sign_test(self):
        self.assertEqual(table.sign_test(0, 0), 1.0)
        self.assertAlmostEqual(table.sign_test(8, 0), 2 / 256)
        self.assertAlmostEqual(table.sign_test(0, 8), 2 / 256)
        self.assertEqual(table.sign_test(3, 3), 1.0)
        self.assertAlmostEqual(table.sign_test(16, 8), 0.1516, places=4)

    def test_a_missing_directory_or_none_is_named(self):
        r = subprocess.run([sys.executable, TABLE, "--pooled"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("needs one or more results directories", r.stderr)
        r = subprocess.run([sys.executable, TABLE, "--pooled", "/nonexistent/run"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no directory /nonexistent/run", r.stderr)
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([sys.executable, TABLE, "--pooled", d], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no results under", r.stderr)


FAKE = textwrap.dedent("""\
    #!/usr/bin/env python3
    # A stand-in for `farcache bench paper`: one complete document per call, its steal the next
    # value of $FAKE_STEALS (a file of one number per line, consumed in order); each call
    # appended to $FAKE_CALLS.
    import json, os, sys
    a = sys.argv[1:]
    if a[:3] == ["bench", "paper", "--cleanup"]:
        sys.exit(0)
    arg = lambda k: a[a.index(k) + 1]
    with open(os.environ["FAKE_STEALS"]) as f:
        steals = f.read().split()
    steal, rest = float(steals[0]), steals[1:]
    with open(os.environ["FAKE_STEALS"], "w") as f:
        f.write("\\n".join(rest))
    with open(os.environ["FAKE_CALLS"], "a") as f:
        f.write(f"{arg('--out')} {arg('--configs')}\\n")
    d = lambda s: {"steal_ticks": int(s * 1000), "cpu_ticks": 1000}
    run = lambda c: {"experiment": "seqread", "size_bytes": 1 << 28, "config": c,
                     "passes": [{"pass": 1, "secs": 1.0, "disk": d(steal if c == "farcache" else 0)}]}
    doc = {"complete": True, "options": {"profile": arg("--profile"), "link_rate": arg("--link")},
           "runs": [run("passthrough"), run("farcache")]}
    with open(os.path.join(arg("--out"), "paper-" + arg("--profile") + ".json"), "w") as f:
        json.dump(doc, f)
    """)


@unittest.skipUnless(os.geteuid() == 0, "scripts/bench-nothing-slower.sh needs root (CI runs as root)")
class Retry(unittest.TestCase):
    def bench(self, steals, **env):
        d = tempfile.mkdtemp()
        self.addCleanup(subprocess.run, ["rm", "-rf", d])
        fake = os.path.join(d, "farcache")
        with open(fake, "w") as f:
            f.write(FAKE)
        os.chmod(fake, 0o755)
        with open(os.path.join(d, "steals"), "w") as f:
            f.write("\n".join(map(str, steals)))
        out = os.path.join(d, "out")
        e = dict(os.environ, BIN=fake, OUT=out, JOBS="raw:seqread", FAKE_STEALS=os.path.join(d, "steals"),
                 FAKE_CALLS=os.path.join(d, "calls"), **env)
        r = subprocess.run(["bash", BENCH], env=e, capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(d, "calls")) as f:
            calls = f.read().split("\n")[:-1]
        return [c.replace(out + "/", "") for c in calls], r.stdout

    def test_disturbed_pairs_are_measured_again_until_enough_are_clean(self):
        calls, log = self.bench([0, 0.2, 0.3, 0], REPEAT="2", RETRY="3")
        # Pair 2 disturbed: pair 3 (passthrough first, odd), disturbed too: pair 4 (farcache
        # first), clean: two clean pairs, done.
        self.assertEqual(calls, ["raw-seqread/rep1 passthrough,farcache", "raw-seqread/rep2 farcache,passthrough",
                                 "raw-seqread/rep3 passthrough,farcache", "raw-seqread/rep4 farcache,passthrough"])
        self.assertIn("pair 3: disturbed (30.0%", log)

    def test_retries_are_bounded(self):
        calls, log = self.bench([0.2, 0.2, 0.2, 0.2], REPEAT="1", RETRY="2")
        self.assertEqual(calls, ["raw-seqread passthrough,farcache", "raw-seqread/rep2 farcache,passthrough",
                                 "raw-seqread/rep3 passthrough,farcache"])
        self.assertIn("0 undisturbed pairs of 3, RETRY=2 spent", log)

    def test_a_clean_run_measures_nothing_more_and_a_rerun_resumes(self):
        calls, _ = self.bench([0, 0], REPEAT="2")
        self.assertEqual(len(calls), 2)

    def test_a_bad_retry_count_is_refused(self):
        d = tempfile.mkdtemp()
        self.addCleanup(subprocess.run, ["rm", "-rf", d])
        r = subprocess.run(["bash", BENCH], env=dict(os.environ, BIN="/bin/true", OUT=d, RETRY="x"),
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("RETRY must be a count", r.stderr)


if __name__ == "__main__":
    unittest.main()
