"""Download a hub repo's parquet shards and convert each as soon as it is verified, with bounded disk.

Downloads are data/hfd.sh runs, one per shard (the same listing, sha256 check and resume as
`bash data/download_YFCC15M.sh`), at most `max_inflight` shards on disk at once. Shards are
converted in listing order by `convert()` into a part of their own, with the sample ids the
two-step path (download everything, then data2rec) gives them, so the records are the same.

A shard's way, every step safe against kill -9 (rerunning resumes at the step it stopped):
  hfd.sh -> WORK/NNNNN/<name>  ->  convert() -> WORK/NNNNN.part.rec/.idx (fsynced)
  -> listed in OUT.onepass.json (fsynced)  ->  renamed to OUT-NNNNN.rec/.idx  -> parquet deleted.
WORK is the hidden folder `.OUT.onepass/` beside the output.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path, PurePosixPath

from src.errors import UserError
from src.fsutil import atomic_write_json, fsync_dir
from src.lock import OutputLock
from src.open_alip.urls import redact_urls
from src.shard_names import (
    IDX,
    ONEPASS_STATE,
    REC,
    REPORT,
    onepass_work,
    output_shards,
    shard_paths,
    side_file,
)

from .items import Unit
from .pipeline import (
    ConvertOptions,
    OutputError,
    check_options,
    check_skips,
    convert,
    output_prefix,
    remove_output_temps,
)
from .processes import die_with_parent
from .sources import InputError
from .sources.base import UnreadableUnit
from .sources.parquet import ParquetSource
from .state import write_report

HFD = Path(__file__).resolve().parents[2] / "data" / "hfd.sh"
DEFAULT_MAX_INFLIGHT = 2
DEFAULT_TRIES = 3
STATE_VERSION = 1
_POLL_S = 0.2


class HubError(UserError):
    """The hub could not be listed, or a shard could not be downloaded after its retries."""

    exit_code = 3


@dataclass
class HubOptions:
    repo_id: str
    include: tuple[str, ...] = ()  # hfd.sh --include globs; none: every parquet file
    revision: str = "main"
    max_inflight: int = DEFAULT_MAX_INFLIGHT  # shards on disk at once (downloading or converting)
    tries: int = DEFAULT_TRIES  # hfd.sh runs per shard before the run gives up


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int
    hash: str


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _hfd_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln or "failed" in ln]
    return redact_urls((errors or lines or ["no output"])[-1])  # a downloader's line may name a URL


def list_hub(hub: HubOptions, revision: str) -> tuple[str, list[HubFile]]:
    """The commit `revision` names and the repo's parquet files at it, in the order the two-step
    conversion reads them (sorted as paths), through hfd.sh's own listing."""
    if not HFD.is_file():
        raise HubError(f"{HFD} is missing; --from-hub runs it, so use a full copy of the repository")
    argv = ["bash", str(HFD), hub.repo_id, "--dataset", "--revision", revision, "--list-only"]
    if hub.include:
        argv += ["--include", *hub.include]
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise HubError(f"listing {hub.repo_id}: {_hfd_error(r.stderr)}")
    lines = r.stdout.splitlines()
    commit = lines[0].split("\t", 1)[1] if lines and lines[0].startswith("commit\t") else revision
    files = []
    for line in lines[1:]:
        size, _kind, digest, name = line.split("\t", 3)
        path = PurePosixPath(name)
        if path.suffix == ".parquet" and not any(p.startswith(".") for p in path.parts):
            files.append(HubFile(name, int(size), digest))
    if not files:
        raise HubError(
            f"{hub.repo_id} at {revision} lists no .parquet files"
            + (" matching --hub-include" if hub.include else "")
            + "; --from-hub converts hub parquet"
        )
    return commit, sorted(files, key=lambda f: PurePosixPath(f.name).parts)


def _glob_escape(name: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in name)


class _Download:
    """One shard's hfd.sh run, retried up to `tries` times. A lock file held by hfd.sh and its
    downloader (the descriptor is inherited) keeps a rerun from fetching into the same folder
    while a killed run's downloader is still stopping."""

    def __init__(self, index: int, file: HubFile, work: Path, hub: HubOptions, commit: str) -> None:
        self.index, self.file = index, file
        self.folder = work / f"{index:05d}"
        self.path = self.folder / file.name
        self.log = work / f"{index:05d}.log"
        self.lock = work / f"{index:05d}.lock"
        self.argv = [
            "bash",
            str(HFD),
            hub.repo_id,
            "--dataset",
            "--revision",
            commit,
            "--include",
            _glob_escape(file.name),
            "--local-dir",
            str(self.folder),
            "-j",
            "1",
        ]
        self.tries_left = hub.tries
        self.proc: subprocess.Popen | None = None
        self.fetched = 0 if self.path.is_file() else file.size
        self.started = time.monotonic()
        self.seconds: float | None = None
        self.failed: str | None = None
        self.start()

    def start(self) -> None:
        self.tries_left -= 1
        fd = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # returns once no earlier run's downloader holds it
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(fd,),
                    preexec_fn=lambda: die_with_parent(signal.SIGTERM),
                )  # hfd.sh stops its downloader on TERM
        finally:
            os.close(fd)

    def poll(self) -> bool:
        """True once the shard is downloaded and verified; retries a failed run."""
        if self.seconds is not None or self.failed or self.proc is None:
            return self.seconds is not None
        rc = self.proc.poll()
        if rc is None:
            return False
        if rc == 0 and self.path.is_file():
            self.seconds = time.monotonic() - self.started
            return True
        if self.tries_left > 0:
            self.start()
        else:
            self.failed = (
                _hfd_error(self.log.read_text(errors="replace")) if self.log.exists() else f"exit {rc}"
            )
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # hfd.sh stops aria2c, which saves its resume state
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _merge(total: dict, part: dict, max_examples: int) -> None:
    for key in ("seen", "written", "converted", "skipped"):
        total[key] = total.get(key, 0) + part[key]
    for key in ("skipped_by_reason", "records_by_caption_count"):
        merged = dict(total.get(key, {}))
        for k, n in part[key].items():
            merged[k] = merged.get(k, 0) + n
        total[key] = dict(sorted(merged.items(), key=lambda kv: (len(kv[0]), kv[0])))
    examples = total.setdefault("examples", {})
    for reason, items in part["examples"].items():
        examples[reason] = (examples.get(reason, []) + items)[:max_examples]


def _rates(shards: list[dict], waited: float, elapsed: float, inflight: int) -> dict:
    """This run's download and conversion rates, side by side (shards resumed as done count not)."""
    mine = [s for s in shards if s.get("this_run")]
    fetched = sum(s["fetched_bytes"] for s in mine)
    dl_s = sum(s["download_s"] for s in mine if s["fetched_bytes"])
    conv_bytes = sum(s["size"] for s in mine)
    conv_s = sum(s["convert_s"] for s in mine)
    rows = sum(s["report"]["seen"] for s in mine)
    return {
        "shards": len(mine),
        "max_inflight": inflight,
        "elapsed_s": round(elapsed, 3),
        "download_bytes": fetched,
        "download_mb_s_per_shard": round(fetched / dl_s / 1e6, 3) if dl_s else None,
        "download_mb_s": round(fetched / elapsed / 1e6, 3) if elapsed and fetched else None,
        "convert_bytes": conv_bytes,
        "convert_s": round(conv_s, 3),
        "convert_mb_s": round(conv_bytes / conv_s / 1e6, 3) if conv_s else None,
        "convert_rows_s": round(rows / conv_s, 1) if conv_s else None,
        "waited_for_download_s": round(waited, 3),
    }


def rate_lines(rates: dict) -> list[str]:
    if not rates.get("shards"):
        return []
    dl = (
        f"download {rates['download_mb_s']:.1f} MB/s ({rates['download_mb_s_per_shard']:.1f} MB/s per shard, "
        f"up to {rates['max_inflight']} at once)"
        if rates["download_mb_s"]
        else "download: nothing fetched"
    )
    conv = (
        f"conversion {rates['convert_mb_s']:.1f} MB/s of parquet ({rates['convert_rows_s']:,.0f} rows/s)"
        if rates["convert_mb_s"]
        else "conversion: no time measured"
    )
    share = rates["waited_for_download_s"] / rates["elapsed_s"] if rates["elapsed_s"] else 0
    # Waiting longer for downloads than converting means more --max-inflight (or a faster link) pays.
    slower = "the download" if rates["waited_for_download_s"] > rates["convert_s"] else "the conversion"
    bound = f"{slower} is the bottleneck (conversion busy {rates['convert_s']:.1f} s)"
    return [
        f"{dl} | {conv}",
        f"the conversion waited {rates['waited_for_download_s']:.1f} s for downloads ({share:.0%} of "
        f"{rates['elapsed_s']:.1f} s): {bound}",
    ]


class _Run:
    def __init__(self, hub: HubOptions, output: str | Path, opts: ConvertOptions, say: Callable[[str], None]):
        self.hub, self.opts, self.say = hub, opts, say
        self.prefix = output_prefix(output)
        self.work = onepass_work(self.prefix)
        self.state_path = side_file(self.prefix, ONEPASS_STATE)
        self.report_path = side_file(self.prefix, REPORT)
        self.started = time.monotonic()
        self.waited = 0.0

    # -- files ---------------------------------------------------------------------------
    def _outputs(self) -> list[Path]:
        return output_shards(self.prefix, numbered_only=True, suffixes=(REC, IDX))

    def _wipe(self) -> None:
        for p in self._outputs():
            p.unlink()
        shutil.rmtree(self.work, ignore_errors=True)
        for p in (self.state_path, self.report_path):
            p.unlink(missing_ok=True)

    def _part(self, index: int) -> Path:
        return self.work / f"{index:05d}.part"

    def _publish(self, entry: dict) -> None:
        """Move a recorded shard's records to their final names, then delete its parquet; safe to
        repeat after a kill at any point."""
        i = entry["index"]
        part_rec, part_idx = shard_paths(self._part(i), None)
        # The .rec last: a reader that sees it can rely on the .idx.
        for key, src in (("idx", part_idx), ("rec", part_rec)):
            if entry[key] is None:
                continue
            dst = self.prefix.parent / entry[key]
            if src.is_file():
                os.replace(src, dst)
            elif not dst.is_file():
                raise OutputError(
                    f"{dst} is recorded as finished in {self.state_path} but is gone; "
                    "pass --overwrite to start over"
                )
        fsync_dir(self.prefix.parent)
        shutil.rmtree(self.work / f"{i:05d}", ignore_errors=True)
        for p in self.work.glob(f"{i:05d}.*"):
            if p.is_file():
                p.unlink()

    # -- the run -------------------------------------------------------------------------
    def run(self) -> dict:
        state = self._load()
        commit, files = list_hub(self.hub, state["commit"] if state else self.hub.revision)
        fingerprint = json.loads(
            json.dumps(
                {
                    "repo_id": self.hub.repo_id,
                    "include": list(self.hub.include),
                    "files": [[f.name, f.size, f.hash] for f in files],
                    "source": asdict(self.opts.source),
                    "image": asdict(self.opts.image),
                    "id_offset": self.opts.id_offset,
                    "max_captions": self.opts.max_captions,
                    "max_file_bytes": self.opts.max_file_bytes,
                }
            )
        )
        if state is not None and state["fingerprint"] != fingerprint:
            raise OutputError(
                f"{self.state_path} belongs to a run with another repo, files or options; rerun "
                "with the same arguments to resume it, or pass --overwrite to start over"
            )
        if state is None:
            if self._outputs():
                raise OutputError(
                    f"{self._outputs()[0]} already exists and no matching {self.state_path.name} "
                    "was found; pass --overwrite to replace it or choose another --output"
                )
            shutil.rmtree(self.work, ignore_errors=True)
            state = {
                "version": STATE_VERSION,
                "fingerprint": fingerprint,
                "commit": commit,
                "shards": [],
                "complete": False,
            }
            self._save(state)
        self.work.mkdir(parents=True, exist_ok=True)
        for entry in state["shards"]:
            entry.pop("this_run", None)
            self._publish(entry)
        if state["complete"]:  # a run killed after it was recorded complete: what it had left to remove
            shutil.rmtree(self.work, ignore_errors=True)
            return {**self._report(state), "resumed": "already complete"}
        self._announce(files, len(state["shards"]), commit)
        self._convert_all(files, state, commit)
        state["complete"] = True
        self._save(state)
        shutil.rmtree(self.work, ignore_errors=True)
        final = self._report(state)
        return final

    def _load(self) -> dict | None:
        if self.opts.overwrite:
            self._wipe()
            return None
        if not self.opts.resume:
            return None  # finished shards then stop the run unless --overwrite, as in convert()
        try:
            state = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) and state.get("version") == STATE_VERSION else None

    def _save(self, state: dict) -> None:
        atomic_write_json(self.state_path, state, durable=True, indent=1, ensure_ascii=True)

    def _announce(self, files: list[HubFile], done: int, commit: str) -> None:
        total = sum(f.size for f in files)
        left = files[done:]
        window = sum(sorted((f.size for f in left), reverse=True)[: self.hub.max_inflight])
        free = shutil.disk_usage(self.prefix.parent).free
        self.say(
            f"one pass: {len(files)} parquet shards ({human(total)}) of {self.hub.repo_id} at {commit[:12]}, "
            f"{done} already converted; --max-inflight {self.hub.max_inflight}: at most "
            f"{self.hub.max_inflight} shards ({human(window)}) on disk at once"
        )
        self.say(
            f"peak disk: the records (about the parquet's size, {human(total)}) + {human(window)}, "
            f"instead of {human(2 * total)} for download then convert; {human(free)} free here"
        )
        needed = sum(f.size for f in left) + window
        if needed > free:
            self.say(
                f"warning: the {len(left)} shards left need about {human(needed)}, more than is free; "
                "the run stops if the disk fills (rerun to resume after freeing space)"
            )

    def _convert_all(self, files: list[HubFile], state: dict, commit: str) -> None:
        downloads: dict[int, _Download] = {}
        try:
            for i in range(len(state["shards"]), len(files)):
                for j in range(i, min(i + self.hub.max_inflight, len(files))):
                    if j not in downloads:
                        downloads[j] = _Download(j, files[j], self.work, self.hub, commit)
                head = downloads[i]
                waited = time.monotonic()
                while not head.poll():
                    if head.failed:
                        raise HubError(
                            f"{files[i].name}: download failed {self.hub.tries} times ({head.failed}); the "
                            f"{i} shard(s) before it are converted, rerun the same command to retry it "
                            f"(log: {head.log})"
                        )
                    for d in downloads.values():
                        d.poll()
                    time.sleep(_POLL_S)
                self.waited += time.monotonic() - waited
                entry = self._convert_one(i, files[i], head, state)
                state["shards"].append(entry)
                self._save(state)
                self._publish(entry)
                del downloads[i]
                write_report(self.report_path, self._report(state))
        finally:
            for d in downloads.values():
                d.stop()

    def _convert_one(self, i: int, file: HubFile, download: _Download, state: dict) -> dict:
        base = self.opts.id_offset + sum(s["rows"] for s in state["shards"])
        source = ParquetSource([download.path], self.opts.source)
        try:
            rows = source.count(Unit(0, str(download.path)))  # as the two-step run counts it for its ids
        except UnreadableUnit as exc:
            # Not recorded as done and not deleted: the rows of a shard are never lost in silence.
            raise HubError(
                f"{file.name} cannot be read ({exc.detail}); the {i} shard(s) before it are converted and "
                f"its download is kept at {download.path}. Rerun the same command to try it again (delete "
                "that file to download it anew)"
            ) from None
        began = time.monotonic()
        part_opts = replace(
            self.opts,
            id_offset=base,
            shard_size=0,
            num_machines=1,
            machine_id=0,
            max_skip_fraction=None,
            resume=True,
            overwrite=False,
        )
        final = convert([download.path], self._part(i), part_opts)
        seconds = time.monotonic() - began
        shard = final["shards"][0] if final["shards"] else None
        rec, idx = shard_paths(self.prefix, i)
        report = {
            k: final[k]
            for k in (
                "seen",
                "written",
                "converted",
                "skipped",
                "skipped_by_reason",
                "examples",
                "records_by_caption_count",
            )
        }
        entry = {
            "index": i,
            "name": file.name,
            "size": file.size,
            "rows": rows,
            "rec": rec.name if shard else None,
            "idx": idx.name if shard else None,
            "records": shard["records"] if shard else 0,
            "bytes": shard["bytes"] if shard else 0,
            "first_id": shard["first_id"] if shard else None,
            "last_id": shard["last_id"] if shard else None,
            "report": report,
            "fetched_bytes": download.fetched,
            "download_s": round(download.seconds or 0, 3),
            "convert_s": round(seconds, 3),
            "this_run": True,
        }
        dl = (
            f"{human(download.fetched)} fetched in {download.seconds:.1f} s "
            f"({download.fetched / max(download.seconds or 0, 1e-9) / 1e6:.1f} MB/s)"
            if download.fetched
            else "already downloaded"
        )
        self.say(
            f"[{i + 1}/{len(state['fingerprint']['files'])}] {file.name}: {dl}; {rows} rows converted in "
            f"{seconds:.1f} s ({file.size / max(seconds, 1e-9) / 1e6:.1f} MB/s, "
            f"{rows / max(seconds, 1e-9):,.0f} rows/s), {report['written']} written"
        )
        return entry

    def _report(self, state: dict) -> dict:
        total: dict = {}
        for s in state["shards"]:
            _merge(total, s["report"], self.opts.max_examples)
        if not total:
            total = {
                "seen": 0,
                "written": 0,
                "converted": 0,
                "skipped": 0,
                "skipped_by_reason": {},
                "examples": {},
                "records_by_caption_count": {},
            }
        shards = [
            {k: s[k] for k in ("rec", "idx", "records", "bytes", "first_id", "last_id")}
            for s in state["shards"]
            if s["rec"]
        ]
        elapsed = time.monotonic() - self.started
        return {
            "output": str(self.prefix),
            "complete": state["complete"],
            "from_hub": {
                "repo_id": self.hub.repo_id,
                "commit": state["commit"],
                "endpoint": redact_urls(os.environ.get("HF_ENDPOINT", "https://huggingface.co")),
            },
            **total,
            "shards": shards,
            "notes": [],
            "rates": _rates(state["shards"], self.waited, elapsed, self.hub.max_inflight),
            "elapsed_s": round(elapsed, 3),
        }


def convert_from_hub(
    hub: HubOptions, output: str | Path, opts: ConvertOptions, say: Callable[[str], None] = print
) -> dict:
    """Download `hub.repo_id`'s parquet shards and convert them to OUT-NNNNN.rec/.idx (NNNNN: the
    shard's position in the listing); the final report, with `rates`. Raises HubError when a shard
    cannot be downloaded (the shards before it are kept) and TooManySkipped as convert() does."""
    check_options(opts)
    problems = [
        (opts.kind in ("auto", "parquet"), f"--from-hub converts hub parquet, not --format {opts.kind}"),
        (opts.shard_size == 0, "--from-hub writes one output shard per hub shard; leave out --shard-size"),
        (opts.num_machines == 1, "--from-hub converts on one machine; leave out --num-machines"),
        (hub.max_inflight >= 1, f"--max-inflight {hub.max_inflight} must be >= 1"),
        (hub.tries >= 1, f"--download-tries {hub.tries} must be >= 1"),
    ]
    problem = next((msg for ok, msg in problems if not ok), None)
    if problem:
        raise InputError(problem)
    run = _Run(hub, output, opts, say)
    try:
        run.prefix.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(
            f"{run.prefix.parent}: cannot create the output folder ({exc.strerror or exc})"
        ) from None
    with OutputLock(run.prefix):
        remove_output_temps(run.prefix)
        final = run.run()
    write_report(run.report_path, final)
    check_skips(final, opts.max_skip_fraction)
    return final
