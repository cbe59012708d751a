"""scripts/tpch-query-profile.py on a paper JSON and watch series shaped like `bench paper`'s."""

import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILE = os.path.join(SCRIPTS, "tpch-query-profile.py")


def run(*args):
    return subprocess.run([sys.executable, PROFILE, *args], capture_output=True, text=True)


def doc(pid, unix_ms, reads, disk_n, disk_us, cpu_us, share=None, fetch=None):
    d = {"pid": pid, "unix_ms": unix_ms, "uptime_ms": unix_ms - 1_000_000, "engine": {},
         "fuse": {"ops": {"read": reads}}, "backing": {"read_latency": {"count": disk_n, "sum_us": disk_us}},
         "cpu": {"user_us": cpu_us, "system_us": 0}}
    if share is not None:
        d["routing"] = {"adaptive": {"disk_share": share}}
    if fetch is not None:
        n, us, got, sent = fetch
        d["remote"] = {"fetch_latency": {"count": n, "sum_us": us}, "bytes_from_servers": got, "bytes_to_servers": sent}
    return d


def query(q, start_ms, secs):
    return {"query": q, "stream": 0, "status": "ok", "secs": secs, "wall_secs": secs, "started_unix_ms": start_ms}


class TpchQueryProfile(unittest.TestCase):
    def write(self, d, passthrough, farcache, runs):
        os.makedirs(os.path.join(d, "stats"))
        for name, docs in [("passthrough", passthrough), ("farcache", farcache)]:
            with open(os.path.join(d, "stats", f"tpch-{name}.mount.stats.jsonl"), "w") as f:
                f.write("\n".join(json.dumps(x) for x in docs) + "\n")
        path = os.path.join(d, "paper-raw.json")
        with open(path, "w") as f:
            json.dump({"tpch": runs}, f)
        return path

    def test_each_query_gets_the_counters_of_the_intervals_it_ran_in(self):
        t = 1_765_000_000_000
        # The passthrough: 2 s intervals; q14 runs 2 s from t+1 s (half of each of two
        # intervals), q2 the next 4 s.
        pt = [doc(5, t + ms, r, n, us, c) for ms, r, n, us, c in [
            (0, 0, 0, 0, 0), (2000, 1000, 1000, 100_000, 20_000), (4000, 3000, 3000, 300_000, 60_000),
            (6000, 5000, 5000, 500_000, 100_000), (8000, 5000, 5000, 500_000, 100_000)]]
        fc = [doc(6, t + ms, r, n, us, c, share, fetch) for ms, r, n, us, c, share, fetch in [
            (0, 0, 0, 0, 0, 1.0, (0, 0, 0, 0)),
            (2000, 1000, 500, 100_000, 40_000, 0.5, (500, 50_000, 2 << 20, 4 << 20)),
            (4000, 3000, 1500, 300_000, 120_000, 0.5, (1500, 150_000, 6 << 20, 12 << 20)),
            (6000, 5000, 4500, 600_000, 200_000, 1.0, (1500, 150_000, 6 << 20, 12 << 20)),
            (8000, 5000, 4500, 600_000, 200_000, 1.0, (1500, 150_000, 6 << 20, 12 << 20))]]
        runs = [
            {"config": "passthrough", "power": [query(14, t + 1000, 2.0), query(2, t + 3000, 4.0)]},
            {"config": "farcache", "power": [query(14, t + 1000, 2.0), query(2, t + 3000, 4.0)]},
        ]
        with tempfile.TemporaryDirectory() as d:
            out = run(self.write(d, pt, fc, runs))
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = {l.split(" | ")[0].strip("| "): l for l in out.stdout.splitlines() if l.startswith("| q") or l.startswith("| all")}
        # q14: half of the first interval and half of the second: 500 + 1000 reads.
        self.assertIn("| q14 | 2.0 / 2.0 | 1,500 | 1,500 / 100 | - / - | - / - | - | 30 | 20.0 |", rows["q14"])
        # farcache's q14: its disk reads and fetches, the MiB, the share at the last interval's end, CPU 2x.
        self.assertIn("| 1,500 | 750 / 200 | 750 / 100 | 3 / 6 | 0.50 | 60 | 40.0 |", rows["q14"])
        # q2 from 3 s to 7 s: half of the second interval (1,000 reads), all of the third
        # (2,000) and half of the fourth (none).
        self.assertIn("| q2 | 4.0 / 4.0 | 3,000 | 3,000 / 100 |", rows["q2"])
        self.assertIn("| all | 6.0 / 6.0 | 4,500 | 4,500 / 100 |", rows["all"])

    def test_a_gzipped_series_reads_as_the_plain_one(self):
        t = 1_765_000_000_000
        pt = [doc(5, t + ms, ms, ms, ms * 100, ms) for ms in (0, 2000, 4000)]
        runs = [{"config": "passthrough", "power": [query(14, t + 1000, 2.0)]}, {"config": "farcache", "power": []}]
        with tempfile.TemporaryDirectory() as d:
            path = self.write(d, pt, [], runs)
            plain = run(path).stdout
            series = os.path.join(d, "stats", "tpch-passthrough.mount.stats.jsonl")
            with open(series, "rb") as src, gzip.open(series + ".gz", "wb") as dst:
                dst.write(src.read())
            os.remove(series)
            zipped = run(path)
        self.assertEqual(zipped.returncode, 0, zipped.stderr)
        self.assertEqual(plain, zipped.stdout)
        self.assertIn("| q14 | 2.0 / - | 2,000 | 2,000 / 100 |", zipped.stdout)

    def test_a_query_outside_the_series_and_a_missing_file_leave_empty_columns(self):
        t = 1_765_000_000_000
        pt = [doc(5, t + ms, ms, ms, ms * 100, ms) for ms in (0, 2000, 4000)]
        runs = [
            {"config": "passthrough", "power": [query(14, t + 1000, 2.0), query(2, t + 9000, 1.0)]},
            {"config": "farcache", "power": [query(14, t + 1000, 2.0), query(2, t + 9000, 1.0)]},
        ]
        with tempfile.TemporaryDirectory() as d:
            path = self.write(d, pt, [], runs)
            os.remove(os.path.join(d, "stats", "tpch-farcache.mount.stats.jsonl"))
            out = run(path)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("no series with a wall clock for farcache", out.stderr)
        q2 = next(l for l in out.stdout.splitlines() if l.startswith("| q2 "))
        self.assertEqual(q2.count(" - "), 14, q2)

    def test_a_daemon_restart_inside_a_query_gives_no_profile(self):
        t = 1_765_000_000_000
        pt = [doc(5, t, 0, 0, 0, 0), doc(5, t + 2000, 100, 100, 100, 100), doc(9, t + 4000, 10, 10, 10, 10)]
        runs = [{"config": "passthrough", "power": [query(14, t + 1000, 2.0)]}, {"config": "farcache", "power": []}]
        with tempfile.TemporaryDirectory() as d:
            out = run(self.write(d, pt, [], runs))
        self.assertEqual(out.returncode, 0, out.stderr)
        q14 = next(l for l in out.stdout.splitlines() if l.startswith("| q14 "))
        self.assertIn("| q14 | 2.0 / - | - | - |", q14)

    def test_an_unreadable_result_is_named(self):
        out = run("/nonexistent/paper-raw.json")
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("cannot read /nonexistent/paper-raw.json", out.stderr)


if __name__ == "__main__":
    unittest.main()
