"""A mkdocs hook: one page per script in examples/, generated from the script itself.

Each page holds the script's docstring, the output of running it (``python
examples/NAME.py`` in a scratch directory, with ``--out`` for the scripts that save
plots there) with the plots it saved, and its source. The scripts run when the site is
built, several at a time, so a page can never show output the script no longer prints;
a script that fails or does not print its ``OK`` line stops the build. Results are
cached between builds (see `outputs.py`). examples/index.md lists them all, and
mkdocs.yml's navigation names each page (the strict build fails on a page it omits).

The examples need the ``examples`` and ``torch`` extras: the docs are built with
``pip install -e ".[docs,examples,torch]"`` (CI's docs stage).
"""

from __future__ import annotations

import ast
import base64
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files
from outputs import ROOT, BuildError, cached, output_block

EXAMPLES = ROOT / "examples"
EXTENSION = EXAMPLES / "cpp_extension"
TIMEOUT_S = 600
# Scripts that save their plots into the folder given by --out (the others save into
# the working directory, or nothing)
TAKES_OUT = {"neural_ode.py", "projectile_events.py", "training_loop.py"}


def scripts() -> list[Path]:
    return sorted(EXAMPLES.glob("*.py"))


def describe(script: Path) -> tuple[str, str]:
    """The title (the docstring's first line, without its full stop) and the rest."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or script.stem
    first, _, rest = doc.partition("\n")
    return first.rstrip("."), rest.strip()


def run(script: Path) -> dict[str, Any]:
    """Run `script` as a reader would; its output and the PNGs it saved (base64)."""
    def compute() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix=f"jaxbridge-{script.stem}-") as scratch:
            argv = [sys.executable, str(script)]
            if script.name in TAKES_OUT:
                argv += ["--out", scratch]
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, cwd=scratch,
                                      timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired as err:
                raise BuildError(f"examples/{script.name} ran past {TIMEOUT_S} s") from err
            plots = {p.name: base64.b64encode(p.read_bytes()).decode()
                     for p in sorted(Path(scratch).glob("*.png"))}
        if proc.returncode != 0 or "OK" not in proc.stdout.splitlines():
            raise BuildError(f"examples/{script.name} failed (exit {proc.returncode}; the docs "
                             f"need pip install -e \".[docs,examples,torch]\"):\n"
                             f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        return {"stdout": proc.stdout, "plots": plots}
    return cached(f"example:{script.name}:{script.read_text()}", compute)


def _check(proc: subprocess.CompletedProcess[str], what: str) -> None:
    if proc.returncode != 0:
        raise BuildError(f"{what} failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")


def extension_files() -> list[Path]:
    return sorted(p for p in EXTENSION.rglob("*") if p.is_file() and p.name != "README.md"
                  and "__pycache__" not in p.parts)


def run_extension() -> dict[str, Any]:
    """Build examples/cpp_extension with CMake (as `pip install .` would) and run the
    command its README gives, with the built package on the path."""
    import pybind11  # the extension's build dependency (the test extra; CI's docs stage)

    def compute() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="jaxbridge-cpp-extension-") as scratch:
            build = Path(scratch) / "build"
            _check(subprocess.run(
                ["cmake", "-S", str(EXTENSION), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DPython_EXECUTABLE={sys.executable}",
                 f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"],
                capture_output=True, text=True, timeout=TIMEOUT_S), "cmake configure")
            _check(subprocess.run(["cmake", "--build", str(build), "-j2"], capture_output=True,
                                  text=True, timeout=TIMEOUT_S), "cmake --build")
            package = Path(scratch) / "site" / "jb_cube"
            shutil.copytree(EXTENSION / "jb_cube", package)
            shutil.copy(next(build.glob("_cube*.so")), package)
            env = {**os.environ, "PYTHONPATH": str(package.parent)}
            proc = subprocess.run([sys.executable, "-c", EXTENSION_COMMAND], capture_output=True,
                                  text=True, env=env, cwd=scratch, timeout=TIMEOUT_S)
            _check(proc, "examples/cpp_extension")
        return {"stdout": proc.stdout}
    sources = "".join(p.read_text() for p in extension_files())
    return cached(f"extension:{EXTENSION_COMMAND}:{sources}", compute)


# The README's command (tests/test_cpp.py builds the extension the same way)
EXTENSION_COMMAND = ("import jax, jax.numpy as jnp, jb_cube; "
                     "print(jax.grad(lambda x: jb_cube.cube(x, factor=2.0).sum())(jnp.ones(3)))")
LANGUAGES = {".cc": "cpp", ".py": "python", ".txt": "cmake", ".toml": "toml"}


def extension_page(result: dict[str, Any]) -> str:
    readme = (EXTENSION / "README.md").read_text().split("\n", 1)[1].strip()
    lines = ["# A C++ extension package", "", readme, "",
             "## Output", "", "The package built with CMake when this site was built, then "
             "the README's command:", "", output_block(result["stdout"], "jb_cube"), "",
             "## The sources", ""]
    for path in extension_files():
        name = path.relative_to(EXAMPLES).as_posix()
        language = LANGUAGES.get(path.suffix, "text")
        lines += [f'```{language} title="examples/{name}"', path.read_text().rstrip(), "```", ""]
    return "\n".join(lines)


def page(script: Path, result: dict[str, Any]) -> str:
    title, intro = describe(script)
    lines = [f"# {title}", "", intro, "",
             f"Run it from the repository root: `python examples/{script.name}`. "
             "The output below is from running it when this site was built.", "",
             "## Output", "", output_block(result["stdout"], f"python examples/{script.name}"),
             ""]
    lines += [f"![{name}]({script.stem}-{name})\n" for name in result["plots"]]
    lines += ["## The script", "", f'```python title="examples/{script.name}"',
              script.read_text().rstrip(), "```", ""]
    return "\n".join(lines)


def index(found: list[Path]) -> str:
    lines = ["# Examples", "",
             "Complete scripts, each checking its own results and printing `OK` at the end. "
             "Every page shows the script and the output of running it when this site was "
             "built. They need `pip install -e \".[examples]\"` (and `\".[torch]\"` for "
             "the PyTorch one); `tests/test_examples.py` runs them all.", "",
             "| example | what it shows |", "|---|---|"]
    for script in found:
        title, _ = describe(script)
        lines.append(f"| [{script.stem}]({script.stem}.md) | {title} |")
    lines += ["| [cpp_extension](cpp_extension.md) | A C++ kernel built ahead of time as a "
              "Python package of its own (CMake, pybind11) |", ""]
    return "\n".join(lines)


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    found = scripts()
    jobs = int(os.environ.get("JAXBRIDGE_DOCS_JOBS", os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        extension = pool.submit(run_extension)
        results = dict(zip(found, pool.map(run, found)))
    files.append(File.generated(config, "examples/index.md", content=index(found)))
    files.append(File.generated(config, "examples/cpp_extension.md",
                                content=extension_page(extension.result())))
    for script, result in results.items():
        files.append(File.generated(config, f"examples/{script.stem}.md",
                                    content=page(script, result)))
        for name, data in result["plots"].items():
            files.append(File.generated(config, f"examples/{script.stem}-{name}",
                                        content=base64.b64decode(data)))
    return files
