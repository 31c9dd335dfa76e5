"""The fleet test (scripts/fleet-test.sh): three `frigg serve` replicas of the bundled demo model,
each in a network namespace of its own, behind HAProxy (deploy/haproxy/haproxy.cfg) on loopback,
under `frigg bench load` through the balancer while one replica is killed and another rolled.

Timeline:
  1. one replica hit directly (inside its namespace), then the balancer, PHASE_S each, no faults:
     the comparison of tok/s and TTFT (on two cores it measures the proxy's overhead, not
     capacity: the replicas share the same cores);
  2. the chaos run, DURATION_S through the balancer: at 30 s replica 1 gets SIGKILL; at 60 s
     replica 2 is rolled (SIGTERM, exit 0 awaited, restarted, /health awaited).

Pass: no request fails during the roll, the requests that fail after the kill are at most those
the killed replica held, every request before the kill and after the failover completes, and the
rolled replica exits 0. Writes the JSON (--json) and, with --markdown, its table between the
bench:fleet markers. Needs root (network namespaces), iproute2 and haproxy.
"""

import argparse
import csv
import io
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRIGG = os.environ.get("FRIGG_BIN", str(ROOT / "target/release/frigg"))
KEY = "fleet-test-key"
NET = "10.71"  # replica i: host side NET.i.1, replica NET.i.2 (a /24 per namespace)
STREAMS = 6
MAX_TOKENS = "16,32"
KILL_AT, ROLL_AT = 30.0, 60.0


def run(*args: str) -> None:
    subprocess.run(args, check=True)


def http_status(url: str, key: str | None = None, timeout: float = 1.0) -> int | None:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


class Replica:
    def __init__(self, i: int, workdir: Path):
        self.i, self.ns, self.addr = i, f"frigg-fleet-{i}", f"{NET}.{i}.2"
        self.log = workdir / f"replica-{i}.log"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def make_namespace(self) -> None:
        host, inner = f"frgf{self.i}h", f"frgf{self.i}n"
        run("ip", "netns", "add", self.ns)
        run("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
        run("ip", "link", "set", inner, "netns", self.ns)
        run("ip", "addr", "add", f"{NET}.{self.i}.1/24", "dev", host)
        run("ip", "link", "set", host, "up")
        for cmd in (["ip", "addr", "add", f"{self.addr}/24", "dev", inner], ["ip", "link", "set", inner, "up"], ["ip", "link", "set", "lo", "up"]):
            run("ip", "netns", "exec", self.ns, *cmd)

    def remove_namespace(self) -> None:
        subprocess.run(["ip", "netns", "del", self.ns], stderr=subprocess.DEVNULL)  # takes its veth pair along

    def start(self) -> None:
        self.starts += 1
        out = open(self.log, "a")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, FRIGG, "serve", "--host", "0.0.0.0", "--port", "8080", "--api-key", KEY,
             "--slots", "2", "--queue", "8", "--threads", "1", "--drain-delay", "3", "--drain-timeout", "30"],
            stdout=out, stderr=out,
        )

    def url(self, path: str) -> str:
        return f"http://{self.addr}:8080{path}"

    def wait_healthy(self, timeout: float = 120) -> float:
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.i} exited: {self.log.read_text()[-2000:]}")
            if http_status(self.url("/health")) == 200:
                return time.time()
            time.sleep(0.05)
        raise RuntimeError(f"replica {self.i} not healthy after {timeout} s")

    def gauge(self, name: str) -> float:
        req = urllib.request.Request(self.url("/metrics"), headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(req, timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise KeyError(name)


class Balancer:
    def __init__(self, workdir: Path, replicas: list[Replica]):
        self.sock = workdir / "haproxy.sock"
        self.port = free_port()
        extra = workdir / "stats.cfg"
        extra.write_text(f"global\n    stats socket {self.sock} mode 600 level admin\n")
        env = {**os.environ, "FRIGG_LB_BIND": f"127.0.0.1:{self.port}", **{f"FRIGG_REPLICA_{r.i}": f"{r.addr}:8080" for r in replicas}}
        self.log = workdir / "haproxy.log"
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(ROOT / "deploy/haproxy/haproxy.cfg"), "-f", str(extra)],
                                     env=env, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)

    def stats(self) -> dict[str, dict[str, str]]:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(2)
        s.connect(str(self.sock))
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        s.close()
        rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
        return {r["svname"]: r for r in rows if r["pxname"] == "frigg_replicas"}

    def wait_status(self, server: str, want: str, timeout: float = 60) -> float:
        t0 = time.time()
        while time.time() - t0 < timeout:
            try:
                if self.stats()[server]["status"].startswith(want):
                    return time.time()
            except (OSError, KeyError):
                pass
            time.sleep(0.02)
        raise RuntimeError(f"HAProxy never marked {server} {want} within {timeout} s")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def bench(url_port: int | None, seconds: float, out: Path, label: str, ns: str | None = None, log: Path | None = None) -> subprocess.Popen:
    cmd = [FRIGG, "bench", "load", "--url", f"http://127.0.0.1:{url_port}", "--streams", str(STREAMS), "--duration", str(seconds),
           "--max-tokens", MAX_TOKENS, "--api-key", KEY, "--label", label, "--json", str(out)]
    if log:
        cmd += ["--log", str(log)]
    if ns:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finished(p: subprocess.Popen, failures_expected: bool = False) -> None:
    _, err = p.communicate()
    # bench load writes its JSON, then exits 2 when any request failed. A SIGKILL fails the
    # streams the killed replica held, so the chaos run counts failures from its log instead.
    if p.returncode != 0 and not (failures_expected and p.returncode == 2 and "requests failed" in err):
        raise RuntimeError(f"bench load failed (exit {p.returncode}): {err[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--phase", type=float, default=30.0, help="seconds of each fault-free comparison run")
    a = ap.parse_args()
    if a.duration < ROLL_AT + 30:
        sys.exit(f"--duration must be at least {ROLL_AT + 30:.0f} s (the roll starts at {ROLL_AT:.0f} s)")
    work = Path(tempfile.mkdtemp(prefix="frigg-fleet-"))
    replicas = [Replica(i, work) for i in (1, 2, 3)]
    lb = None
    try:
        for r in replicas:
            r.remove_namespace()
            r.make_namespace()
            r.start()
        for r in replicas:
            r.wait_healthy()
        lb = Balancer(work, replicas)
        for r in replicas:
            lb.wait_status(f"r{r.i}", "UP")

        # 1. One replica directly, then the balancer: no faults.
        finished(bench(8080, a.phase, work / "direct.json", "one replica, direct", ns=replicas[0].ns))
        finished(bench(lb.port, a.phase, work / "balanced.json", "through HAProxy, 3 replicas"))
        direct = json.loads((work / "direct.json").read_text())
        balanced = json.loads((work / "balanced.json").read_text())

        # 2. The chaos run.
        stot0 = {k: int(v["stot"]) for k, v in lb.stats().items() if k.startswith("r")}
        t0 = time.time()
        chaos = bench(lb.port, a.duration, work / "chaos.json", "through HAProxy, kill + roll", log=work / "chaos.jsonl")
        victim, rolled = replicas[0], replicas[1]
        time.sleep(max(0.0, t0 + KILL_AT - time.time()))
        # What r1 holds: its own gauges (admitted or queued) and HAProxy's open sessions to it,
        # which also count requests r1 accepted but had not queued yet; read on both sides of
        # the kill so that one routed in between is counted.
        held = victim.gauge("frigg_running_requests") + victim.gauge("frigg_queue_depth")
        sessions = int(lb.stats()["r1"]["scur"])
        t_kill = time.time()
        victim.proc.send_signal(signal.SIGKILL)  # `ip netns exec` execs frigg: same pid
        sessions = max(sessions, int(lb.stats()["r1"]["scur"]))
        t_down = lb.wait_status("r1", "DOWN")

        time.sleep(max(0.0, t0 + ROLL_AT - time.time()))
        t_roll = time.time()
        rolled.proc.send_signal(signal.SIGTERM)
        rolled_exit = rolled.proc.wait(timeout=60)
        t_exit = time.time()
        rolled.start()
        t_healthy = rolled.wait_healthy()
        t_up = lb.wait_status("r2", "UP")
        finished(chaos, failures_expected=True)
        stot1 = {k: int(v["stot"]) for k, v in lb.stats().items() if k.startswith("r")}

        lines = [json.loads(l) for l in (work / "chaos.jsonl").read_text().splitlines()]
        report = json.loads((work / "chaos.json").read_text())
        failed = [l for l in lines if not l["ok"]]
        during_roll = [l for l in failed if l["end"] >= t_roll and l["start"] <= t_up]
        # a SIGKILL may fail only what r1 held: requests that started before it and ended after
        after_kill = [l for l in failed if l["start"] <= t_kill <= l["end"]]
        outside = [l for l in failed if l not in during_roll and l not in after_kill]
        served = {k: stot1[k] - stot0.get(k, 0) for k in stot1}
        total_served = sum(served.values()) or 1
        out = {
            "command": " ".join(["scripts/fleet-test.sh", *sys.argv[1:]]),
            "frigg": subprocess.run([FRIGG, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[0],
            "haproxy": subprocess.run(["haproxy", "-v"], capture_output=True, text=True).stdout.splitlines()[0],
            "machine": direct.get("machine"),
            "replicas": "3 x `frigg serve` (bundled demo model, --slots 2 --queue 8 --threads 1 --drain-delay 3), one network namespace each",
            "load": f"frigg bench load: {STREAMS} streaming clients, max_tokens {MAX_TOKENS}",
            "duration_s": a.duration,
            "requests": len(lines),
            "completed": len(lines) - len(failed),
            "failed": len(failed),
            "failed_during_roll": len(during_roll),
            "in_flight_at_kill": max(sessions, int(held)),
            "r1_gauges_at_kill": int(held),
            "haproxy_sessions_at_kill": sessions,
            "failed_after_kill": len(after_kill),
            "failed_otherwise": len(outside),
            "failure_samples": sorted({l["error"] or "" for l in failed})[:5],
            "kill_at_s": round(t_kill - t0, 2),
            "failover_s": round(t_down - t_kill, 3),
            "roll_at_s": round(t_roll - t0, 2),
            "rolled_exit_code": rolled_exit,
            "drain_s": round(t_exit - t_roll, 2),
            "restart_to_healthy_s": round(t_healthy - t_exit, 2),
            "readmit_s": round(t_up - t_healthy, 3),
            "share": {k: round(v / total_served, 3) for k, v in sorted(served.items())},
            "served": dict(sorted(served.items())),
            "chaos": {k: report[k] for k in ("aggregate_tok_s", "ttft_p50_s", "ttft_p95_s")},
            "direct": {k: direct[k] for k in ("requests", "errors", "aggregate_tok_s", "ttft_p50_s", "ttft_p95_s", "load_before", "load_after")},
            "balanced": {k: balanced[k] for k in ("requests", "errors", "aggregate_tok_s", "ttft_p50_s", "ttft_p95_s", "load_before", "load_after")},
        }
        ok = out["failed_during_roll"] == 0 and out["failed_after_kill"] <= out["in_flight_at_kill"] and not outside and rolled_exit == 0 and direct["errors"] == 0 and balanced["errors"] == 0
        out["pass"] = ok
        text = json.dumps(out, indent=2)
        print(text)
        if a.json:
            a.json.write_text(text + "\n")
        if a.markdown:
            write_markdown(a.markdown, out)
        return 0 if ok else 1
    finally:
        if lb:
            lb.proc.terminate()
        for r in replicas:
            if r.proc and r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
                try:
                    r.proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    r.proc.kill()
            r.remove_namespace()


def ms(seconds: float | None) -> str:
    """A TTFT cell: milliseconds, or "–" when `bench load` measured none (no request streamed text)."""
    return "–" if seconds is None else f"{seconds * 1e3:.0f} ms"


def write_markdown(path: Path, o: dict) -> None:
    m = o["machine"] or {}
    d, b = o["direct"], o["balanced"]
    body = f"""Generated by `{o['command']}` ({o['frigg']}; {o['haproxy']}).

Machine: {m.get('cpu', '?')} · {m.get('cores', '?')} cores · {m.get('mem_gib', 0):.1f} GiB. {o['replicas']}; {o['load']}.

| chaos run ({o['duration_s']:.0f} s through HAProxy) | value |
|---|---|
| requests / completed / failed | {o['requests']} / {o['completed']} / {o['failed']} |
| SIGKILL of r1 at {o['kill_at_s']} s: requests in flight on r1 (HAProxy's sessions to it; r1's own gauges) / failed, each in flight at the kill | {o['in_flight_at_kill']} ({o['haproxy_sessions_at_kill']}; {o['r1_gauges_at_kill']}) / **{o['failed_after_kill']}** |
| failover (kill → HAProxy marks r1 down) | {o['failover_s']} s |
| roll of r2 at {o['roll_at_s']} s: failed during the roll | **{o['failed_during_roll']}** |
| r2's drain (SIGTERM → exit {o['rolled_exit_code']}) / restart → /health 200 / readmit (→ HAProxy up) | {o['drain_s']} s / {o['restart_to_healthy_s']} s / {o['readmit_s']} s |
| requests per replica (share) | {', '.join(f"{k} {o['served'][k]} ({v:.0%})" for k, v in o['share'].items())} |
| failed at other times (a request started after the kill included) | {o['failed_otherwise']} |

| fault-free, {STREAMS} clients | requests | errors | aggregate tok/s | TTFT p50 | TTFT p95 | load before → after |
|---|---|---|---|---|---|---|
| one replica, hit directly | {d['requests']} | {d['errors']} | {d['aggregate_tok_s']:.1f} | {ms(d['ttft_p50_s'])} | {ms(d['ttft_p95_s'])} | {d['load_before']:.2f} → {d['load_after']:.2f} |
| three replicas through HAProxy | {b['requests']} | {b['errors']} | {b['aggregate_tok_s']:.1f} | {ms(b['ttft_p50_s'])} | {ms(b['ttft_p95_s'])} | {b['load_before']:.2f} → {b['load_after']:.2f} |

On this {m.get('cores', '?')}-core machine the three replicas, HAProxy and the load generator share the same cores, so the
second row measures what the balancer adds (a hop, health checks, leastconn), not the capacity of three machines."""
    text = path.read_text()
    begin, end = "<!-- bench:fleet:begin -->", "<!-- bench:fleet:end -->"
    if begin not in text or end not in text:
        sys.exit(f"{path}: no {begin} … {end} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{body}\n{end}{tail}")


if __name__ == "__main__":
    sys.exit(main())
