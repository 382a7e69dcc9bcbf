"""kvchat built as a wheel and installed (not editable) runs away from the checkout: the packages are
found, the kernels' C source and the stylesheet ship with it."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import sys
from pathlib import Path
import app, engine, storage
from app.tui.styles import stylesheet
from engine.cpu.kernels import HEADERS, SOURCES
from app.cli.main import main
target = Path(sys.argv[1])
for module in (app, engine, storage):
    assert Path(module.__file__).is_relative_to(target), module.__file__
for source in SOURCES + HEADERS:
    assert source.is_file() and source.is_relative_to(target), source
print(stylesheet())
sys.exit(main(["--version"]))
"""


def test_a_built_wheel_holds_everything_and_runs_from_an_install(tmp_path):
    # Built from a copy: setuptools builds in the source tree and never clears its build/ folder.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "app", "engine", "storage", "assets"):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (ROOT / name).is_dir() else {}))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(source)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    wheel = next((tmp_path / "dist").glob("kvchat-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {"engine/cpu/csrc/block_quant.c", "engine/cpu/csrc/block_quant.h",
            "engine/cpu/csrc/decode_step.c"} <= set(names)
    assert any(n.endswith(".data/data/share/kvchat/kvchat.tcss") for n in names)
    assert not any(n.startswith(("tests/", "assets/")) for n in names)

    prefix, target = tmp_path / "prefix", tmp_path / "prefix" / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                              str(wheel)], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    # pip --target puts data files under the target; a real install puts them under sys.prefix.
    (prefix / "share").mkdir(parents=True)
    (target / "share" / "kvchat").rename(prefix / "share" / "kvchat")
    run = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); "
                          f"sys.prefix = {str(prefix)!r}; sys.argv = ['probe', {str(target)!r}]; exec({PROBE!r})"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    styles, version = run.stdout.splitlines()
    assert Path(styles) == prefix / "share" / "kvchat" / "kvchat.tcss" and Path(styles).is_file()
    assert version.startswith("kvchat ")
