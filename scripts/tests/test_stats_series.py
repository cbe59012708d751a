"""scripts/stats-series.py on series shaped like `farcache stats MNT --watch D --json`'s."""

import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERIES = os.path.join(SCRIPTS, "stats-series.py")


def run(*args):
    return subprocess.run([sys.executable, SERIES, *args], capture_output=True, text=True)


def doc(pid, ms, disk, lenders, fills, share, hit=60.0, weight=0.91):
    return {
        "pid": pid, "backing_dir": "/b", "uptime_secs": ms // 1000, "uptime_ms": ms,
        "engine": {"adaptive_disk": disk, "adaptive_remote": lenders, "fills": fills, "read_arounds": 0, "adaptive_probes": 1},
        "routing": {"mode": "adaptive", "adaptive": {"disk_share": share, "disk_over_remote": 0.5, "remote_hit_us": hit,
                                                     "disk_window_mean_us": 30.0, "lenders_held": 0.1, "lender_miss_us": 90.0,
                                                     "probe_backoff": 2, "disk_weight": weight}},
    }


class StatsSeries(unittest.TestCase):
    def write(self, d, lines):
        path = os.path.join(d, "s.jsonl")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def test_intervals_count_what_happened_in_them_and_a_new_pid_starts_a_series(self):
        with tempfile.TemporaryDirectory() as d:
            lines = [json.dumps(x) for x in [
                doc(7, 1000, 100, 0, 5, 1.0), doc(7, 3000, 400, 50, 25, 0.9), doc(7, 5500, 1000, 50, 26, 1.0),
                doc(8, 800, 10, 0, 0, 1.0), doc(8, 2800, 30, 0, 1, 1.0),
            ]] + ['{"pid": 8, "uptime_ms": 48']  # a watch stopped mid-line
            out = run(self.write(d, lines))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("pid 7, backing /b, 3 samples", out.stdout)
        self.assertIn("     3.0 s (+2.0) disk 300 lenders 50 fills 20 read_arounds 0 probes 0 | share 0.900", out.stdout)
        self.assertIn("     5.5 s (+2.5) disk 600 lenders 0 fills 1 ", out.stdout)
        # The routing's state at the interval's end: the disk's weight among it.
        self.assertIn("| share 0.900 d/r 0.50 w 0.91 hit 60 µs disk 30 µs held 0.10 miss 90 µs backoff 2", out.stdout)
        self.assertIn("over 4.5 s: disk 900, lenders 50, fills 21, read_arounds 0, probes 0; disk share lowest 0.900, below 1 in 1 of 3 samples", out.stdout)
        self.assertIn("pid 8, backing /b, 2 samples", out.stdout)
        self.assertIn("over 2.0 s: disk 20, lenders 0, fills 1", out.stdout)
        self.assertIn("1 line(s) not a mount's stats document, skipped", out.stderr)

    def test_an_interval_says_what_it_read_and_what_the_reads_took(self):
        def io(d, ms, reads, disk_n, disk_us, gets, get_us, got, sent):
            d["uptime_ms"] = ms
            d["fuse"] = {"ops": {"read": reads}}
            d["backing"] = {"read_latency": {"count": disk_n, "sum_us": disk_us}}
            d["remote"] = {"fetch_latency": {"count": gets, "sum_us": get_us},
                           "bytes_from_servers": got, "bytes_to_servers": sent}
            return d
        with tempfile.TemporaryDirectory() as d:
            lines = [json.dumps(x) for x in [
                io(doc(7, 0, 0, 0, 0, 1.0), 1000, 100, 50, 5000, 10, 900, 0, 0),
                io(doc(7, 0, 0, 0, 0, 1.0), 3000, 1100, 450, 85000, 410, 40900, 3 << 20, 8 << 20),
            ]]
            # The passthrough's (no lenders, no routing state): its reads and its disk's.
            bare = [{"pid": 9, "uptime_ms": ms, "engine": {}, "fuse": {"ops": {"read": r}},
                     "backing": {"read_latency": {"count": n, "sum_us": us}},
                     "cpu": {"user_us": cpu, "system_us": 2 * cpu}}
                    for ms, r, n, us, cpu in [(1000, 0, 0, 0, 1000), (3000, 800, 400, 40000, 5000), (5000, 800, 400, 40000, 5000)]]
            out = run(self.write(d, lines + [json.dumps(x) for x in bare]))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("| fuse reads 1000 disk 400 at 200 µs fetches 400 at 100 µs MiB in 3 out 8", out.stdout)
        # The daemon's CPU in the interval, and per read: 4 ms user and 8 system over 800 reads.
        self.assertIn("| fuse reads 800 disk 400 at 100 µs fetches - MiB in - out - cpu 12 ms (15 µs a read)", out.stdout)
        # An interval with no disk reads has no mean to give, and no read to divide its CPU by.
        self.assertIn("| fuse reads 0 disk 0 at - µs fetches - MiB in - out - cpu 0 ms\n", out.stdout)
        # A daemon from before the `cpu` section: none shown.
        self.assertIn("fetches 400 at 100 µs MiB in 3 out 8\n", out.stdout)

    def test_every_nth_interval_keeps_the_last_sample(self):
        with tempfile.TemporaryDirectory() as d:
            lines = [json.dumps(doc(7, 1000 * k, 10 * k, 0, 0, 1.0)) for k in range(1, 6)]
            out = run(self.write(d, lines), "--every", "3")
        self.assertEqual(out.returncode, 0, out.stderr)
        body = [l for l in out.stdout.splitlines() if " s (+" in l]
        self.assertEqual(len(body), 2, out.stdout)
        self.assertTrue(body[0].startswith("     4.0 s (+3.0) disk 30 "), body)
        self.assertTrue(body[1].startswith("     5.0 s (+1.0) disk 10 "), body)

    def test_a_gzipped_series_reads_as_the_plain_one(self):
        with tempfile.TemporaryDirectory() as d:
            lines = [json.dumps(doc(7, 1000 * k, 10 * k, k, 0, 1.0)) for k in range(1, 4)]
            plain = self.write(d, lines)
            zipped = os.path.join(d, "s.jsonl.gz")
            with open(plain, "rb") as src, gzip.open(zipped, "wb") as dst:
                dst.write(src.read())
            a, b = run(plain), run(zipped)
        self.assertEqual(b.returncode, 0, b.stderr)
        self.assertEqual(a.stdout.replace(plain, "F"), b.stdout.replace(zipped, "F"))
        self.assertIn("disk 20, lenders 2", b.stdout)

    def test_a_missing_file_and_a_bad_count_are_named(self):
        out = run("/nonexistent/s.jsonl")
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("cannot read /nonexistent/s.jsonl", out.stderr)
        out = run("x", "--every", "0")
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("--every takes a positive count", out.stderr)


if __name__ == "__main__":
    unittest.main()
