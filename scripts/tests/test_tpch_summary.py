"""scripts/tpch-summary.py on result documents shaped like `bench paper`'s."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUMMARY = os.path.join(SCRIPTS, "tpch-summary.py")


def run(*dirs):
    return subprocess.run([sys.executable, SUMMARY, *dirs], capture_output=True, text=True, check=True).stdout


def phase(secs, daemon_ms):
    return {"secs": secs, "cpu": {"client_ms": 2 * daemon_ms, "daemon_ms": daemon_ms, "lenders_ms": 40, "machine_ms": 3 * daemon_ms}}


class TpchSummary(unittest.TestCase):
    def test_each_run_gives_its_times_memory_reads_and_cpu(self):
        with tempfile.TemporaryDirectory() as d:
            run_ok = {
                "config": "farcache", "error": None, "load_secs": 66.4, "power_secs": 182.6, "throughput_secs": 299.0,
                "queries_per_hour": 529.7, "daemon_anon_bytes": 82 << 20, "daemon_rss_bytes": 92 << 20,
                "mount": {"remote_reads": 4457134, "backing_reads": 702368, "bytes_from_servers": 62_800_000_000},
                "load": phase(66.4, 25740), "power_phase": phase(182.6, 101210), "throughput_phase": phase(299.0, 215660),
            }
            failed = {"config": "passthrough", "error": "query 5 timed out"}
            json.dump({"tpch": [run_ok, failed]}, open(os.path.join(d, "paper-cloud.json"), "w"))
            out = run(d)
        self.assertIn("farcache: load 66.4 s, power 182.6 s, throughput 299.0 s = 530 queries/h", out)
        self.assertIn("daemon anonymous 82 MiB, resident 92 MiB", out)
        self.assertIn("lender reads 4457134, disk reads 702368, 62.8 GB from lenders", out)
        self.assertIn("power_phase: CPU s client 202.4, daemon 101.2, lenders 0.0, machine 303.6", out)
        self.assertIn("passthrough: failed: query 5 timed out", out)

    def test_a_directory_without_results_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            self.assertIn("no paper-*.json", run(d))


if __name__ == "__main__":
    unittest.main()
