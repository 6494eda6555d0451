#!/usr/bin/env python3
"""Fetches the real chat templates check_jinja.py renders, into OUT_DIR:
llama.cpp's models/templates/*.jinja from llama-cpp-python's source
distribution (pip download; pip's cache answers when it has it) and the
test model's own template from its GGUF (tokenizer.chat_template).

usage: fetch_templates.py OUT_DIR [MODEL.gguf]

Nothing third-party is committed: rerun this to get the same files.
"""
import glob
import os
import subprocess
import sys
import tarfile
import tempfile

SDIST = "llama-cpp-python==0.3.36"


def fetch_llama_cpp(out):
    if glob.glob(os.path.join(out, "*.jinja")) and os.path.exists(os.path.join(out, ".llama_cpp_done")):
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST, "-d", tmp],
                       check=True, stdout=subprocess.DEVNULL)
        (sdist,) = glob.glob(os.path.join(tmp, "*.tar.gz"))
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                parts = m.name.split("/")
                if m.isfile() and m.name.endswith(".jinja") and "/vendor/llama.cpp/models/templates/" in m.name \
                        and len(parts) == 6:
                    with tar.extractfile(m) as f, open(os.path.join(out, parts[-1]), "wb") as g:
                        g.write(f.read())
    open(os.path.join(out, ".llama_cpp_done"), "w").close()


def fetch_gguf(out, model):
    from gguf import GGUFReader
    r = GGUFReader(model)
    f = r.fields["tokenizer.chat_template"]
    text = bytes(f.parts[f.data[0]]).decode("utf-8")
    with open(os.path.join(out, "SmolLM2-135M-Instruct.gguf.jinja"), "w", encoding="utf-8") as g:
        g.write(text)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    fetch_llama_cpp(out)
    if len(sys.argv) > 2 and os.path.exists(sys.argv[2]):
        fetch_gguf(out, sys.argv[2])
    print(f"{len(glob.glob(os.path.join(out, '*.jinja')))} templates in {out}")


if __name__ == "__main__":
    main()
