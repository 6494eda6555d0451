"""Golden data regenerated only when its inputs change.

A generator calls `cached(out_dir, name, inputs, extra, generate)`. The
stamp OUT_DIR/.stamp-NAME.json holds a key (sha256 of the generator's
source, of every input file's bytes, of `extra` and of the versions of the
packages that shape the output) and the files `generate` wrote, with their
sizes. When the key matches and those files are all there, `generate` is
skipped; otherwise it runs and the stamp is rewritten. A copied golden folder
(CI's sanitizer build reuses the first build's) stays valid: the key names
file contents, not paths.
"""
import hashlib
import json
import sys
import time
from importlib import metadata
from pathlib import Path

PACKAGES = ("llama_cpp_python", "gguf", "numpy", "tokenizers", "safetensors", "torch")


def _key(inputs, extra):
    h = hashlib.sha256()
    for f in [Path(sys.argv[0]).resolve(), Path(__file__).resolve(), *map(Path, inputs)]:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    for p in PACKAGES:
        try:
            h.update(f"{p}={metadata.version(p)}\0".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{p}=none\0".encode())
    h.update(json.dumps(list(extra)).encode())
    return h.hexdigest()


def _fresh(out, stamp, key):
    try:
        s = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    files = s.get("files") or {}
    return s.get("key") == key and bool(files) and all(
        (out / p).is_file() and (out / p).stat().st_size == n for p, n in files.items())


def cached(out, name, inputs, extra, generate):
    """Runs generate() unless OUT/.stamp-NAME.json says that its outputs,
    made from the same inputs, are all in `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = out / f".stamp-{name}.json"
    key = _key(inputs, extra)
    if _fresh(out, stamp, key):
        print(f"{name}: up to date in {out} (inputs unchanged; delete {stamp.name} to regenerate)")
        return
    stamp.unlink(missing_ok=True)
    t0 = time.time_ns() - 2_000_000_000  # file times lag the clock by a tick
    generate()
    files = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*"))
             if p.is_file() and not p.name.startswith(".stamp-") and p.stat().st_mtime_ns >= t0}
    stamp.write_text(json.dumps({"key": key, "files": files}, indent=1))
