"""lumigo_injector.so at the ELF/libc level, with real programs on glibc and musl.

- the library has no libc dependency (readelf), for x86_64 and aarch64;
- a C program built with gcc and with musl-gcc sees our values through getenv() and environ
  when it is a "runtime" (a copy named node / python3), and the user's values are kept;
- non-targets (/bin/true, sh, a static binary, Go with and without cgo, a libc-free dynamic
  program) behave exactly as without the injector; valgrind finds no error;
- the static image entrypoint copies the payload tree exactly.
"""

from __future__ import annotations

import filecmp
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.injector import PROGRAMS, ROOT, TOKEN, base_env, compile_c

SO_BUILDS = ROOT / "build" / "injector"
ARCHES = {"x86_64": "X86-64", "aarch64": "AArch64"}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """envprobe for glibc and musl (also as `node` / `python3` copies), static, nolibc, Go."""
    out = tmp_path_factory.mktemp("programs")
    built = {
        "glibc": compile_c(PROGRAMS / "envprobe.c", out / "glibc" / "envprobe"),
        "musl": compile_c(PROGRAMS / "envprobe.c", out / "musl" / "envprobe", "musl-gcc"),
        "static": compile_c(PROGRAMS / "envprobe.c", out / "static" / "envprobe", "gcc", "-static"),
        "nolibc": compile_c(
            PROGRAMS / "nolibc.c", out / "nolibc", "gcc", "-nostdlib", "-fPIE", "-pie"
        ),
    }  # fmt: skip
    for libc in ("glibc", "musl"):
        for name in ("node", "python3", "python3.12", "java"):
            shutil.copy2(built[libc], out / libc / name)
    for cgo in ("0", "1"):
        exe = out / f"hello-go-cgo{cgo}"
        env = {**os.environ, "CGO_ENABLED": cgo, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
        subprocess.run(["go", "build", "-o", str(exe), str(PROGRAMS / "hello.go")], check=True,
                       env=env, cwd=out)  # fmt: skip
        built[f"go-cgo{cgo}"] = exe
    return built


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)


def injected_env(payload: Path, home: Path, **extra: str) -> dict[str, str]:
    so = payload / "injector" / "lumigo_injector.so"
    return {**base_env(home), "LD_PRELOAD": str(so), "LUMIGO_TRACER_TOKEN": TOKEN, **extra}


def probe(output: str) -> dict[str, str | None]:
    """envprobe output -> {"getenv NAME": value-or-None, "environ NAME": ...}."""
    seen: dict[str, str | None] = {}
    for line in output.splitlines():
        how, rest = line.split(" ", 1)
        if rest.endswith(" unset"):
            seen[f"{how} {rest[: -len(' unset')]}"] = None
        else:
            name, value = rest.split("=", 1)
            seen[f"{how} {name}"] = value
    return seen


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_library_has_no_libc_dependency(arch: str, injector_payload: Path) -> None:
    so = SO_BUILDS / arch / "lumigo_injector.so"
    assert so.exists(), (
        f"{so} missing: `make payload` builds it (aarch64 needs gcc-aarch64-linux-gnu)"
    )
    header = subprocess.run(["readelf", "-h", str(so)], capture_output=True, text=True).stdout
    assert ARCHES[arch] in header
    dynamic = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout
    assert "NEEDED" not in dynamic
    assert "INIT_ARRAY" in dynamic
    symbols = subprocess.run(
        ["readelf", "--dyn-syms", "-W", str(so)], capture_output=True, text=True
    )
    undefined = {
        (fields[4], fields[7])
        for fields in (line.split() for line in symbols.stdout.splitlines())
        if len(fields) >= 8 and fields[6] == "UND"
    }
    assert undefined == {("WEAK", "getenv"), ("WEAK", "setenv"), ("WEAK", "environ")}
    if arch == platform.machine():
        assert (
            injector_payload / "injector" / "lumigo_injector.so"
        ).read_bytes() == so.read_bytes()


@pytest.mark.parametrize("libc", ["glibc", "musl"])
def test_runtime_sees_values_through_getenv_and_environ(
    libc: str, programs: dict[str, Path], injector_payload: Path, tmp_path: Path
) -> None:
    bootstrap_js = injector_payload / "nodejs" / "lumigo-bootstrap.js"
    bootstrap_py = injector_payload / "python" / "bootstrap"
    so = injector_payload / "injector" / "lumigo_injector.so"
    user_preload = f"{so}:/nonexistent/user.so"
    env = injected_env(injector_payload, tmp_path, NODE_OPTIONS="--max-old-space-size=64",
                       PYTHONPATH="/srv/app/lib", LD_PRELOAD=user_preload)  # fmt: skip
    folder = programs[libc].parent

    node = probe(run([str(folder / "node")], env).stdout)
    python = probe(run([str(folder / "python3.12")], env).stdout)
    itself = probe(run([str(folder / "envprobe")], env).stdout)

    for how in ("getenv", "environ"):
        assert node[f"{how} NODE_OPTIONS"] == f"--require {bootstrap_js} --max-old-space-size=64"
        assert node[f"{how} PYTHONPATH"] == "/srv/app/lib"
        assert python[f"{how} PYTHONPATH"] == f"{bootstrap_py}:/srv/app/lib"
        assert python[f"{how} NODE_OPTIONS"] == "--max-old-space-size=64"
        for seen in (node, python, itself):
            assert seen[f"{how} LD_PRELOAD"] == user_preload
        # not a runtime: untouched
        assert itself[f"{how} NODE_OPTIONS"] == "--max-old-space-size=64"
        assert itself[f"{how} PYTHONPATH"] == "/srv/app/lib"


def test_runtime_values_are_added_once_and_only_with_a_token(
    programs: dict[str, Path], injector_payload: Path, tmp_path: Path
) -> None:
    node = str(programs["glibc"].parent / "node")
    bootstrap_js = injector_payload / "nodejs" / "lumigo-bootstrap.js"
    env = injected_env(injector_payload, tmp_path)
    first = probe(run([node], env).stdout)["getenv NODE_OPTIONS"]
    assert first == f"--require {bootstrap_js}"
    # a child process inherits the edited value: it must not be added a second time
    again = probe(run([node], {**env, "NODE_OPTIONS": str(first)}).stdout)
    assert again["getenv NODE_OPTIONS"] == first
    # no token: nothing is activated (the distro could not send anything anyway)
    without = {k: v for k, v in env.items() if k != "LUMIGO_TRACER_TOKEN"}
    assert probe(run([node], without).stdout)["getenv NODE_OPTIONS"] is None
    # a payload without the bootstrap files (init container failed): nothing is added, so Node
    # does not exit on a missing --require
    empty = tmp_path / "empty" / "injector"
    empty.mkdir(parents=True)
    shutil.copy2(injector_payload / "injector" / "lumigo_injector.so", empty)
    broken = {**env, "LD_PRELOAD": str(empty / "lumigo_injector.so")}
    assert probe(run([node], broken).stdout)["getenv NODE_OPTIONS"] is None


@pytest.mark.parametrize("libc", ["glibc", "musl"])
def test_a_javaagent_anywhere_on_a_long_command_line_keeps_ours_out(
    libc: str, programs: dict[str, Path], injector_payload: Path, tmp_path: Path
) -> None:
    """A JVM whose command line has its own -javaagent gets nothing of ours, however far into
    the command line the flag is: a JVM's classpath and -D flags can run to hundreds of KiB.
    Here the flag straddles 32 KiB (where the injector once stopped reading /proc/self/cmdline)
    and comes after 960 KiB of arguments. envprobe copied as `java`: its arguments are the
    names of the variables it prints."""
    java = str(programs[libc].parent / "java")
    env = injected_env(injector_payload, tmp_path)
    ours = f"-javaagent:{injector_payload / 'java' / 'opentelemetry-javaagent.jar'}"
    own = "-javaagent:/srv/own-agent.jar"

    def java_tool_options(*args: str) -> str | None:
        result = run([java, *args, "JAVA_TOOL_OPTIONS"], env)
        assert result.returncode == 0, result.stderr
        return probe(result.stdout)["getenv JAVA_TOOL_OPTIONS"]

    straddling = "-Dpad=" + "x" * (32 * 1024 - 4 - len(java) - 1 - len("-Dpad=") - 1)
    assert len(java) + 1 + len(straddling) + 1 == 32 * 1024 - 4  # "-jav" before 32 KiB
    far = ["-Dpad=" + "x" * (120 * 1024)] * 8
    assert java_tool_options() == ours
    assert java_tool_options(*far) == ours
    assert java_tool_options(straddling, own) is None
    assert java_tool_options(*far, own) is None
    assert java_tool_options(*far, "-Dx=-javaagent:/in/a/value.jar") == ours  # not an argument


def test_debug_output_only_when_asked_and_never_the_token(
    programs: dict[str, Path], injector_payload: Path, tmp_path: Path
) -> None:
    node = str(programs["musl"].parent / "node")
    quiet = run([node], injected_env(injector_payload, tmp_path))
    assert quiet.stderr == ""
    loud = run([node], injected_env(injector_payload, tmp_path, LUMIGO_INJECTOR_DEBUG="true"))
    assert "lumigo-injector: node: NODE_OPTIONS=--require" in loud.stderr
    assert TOKEN not in loud.stderr


@pytest.mark.parametrize(
    "program",
    [
        "/bin/true",
        "sh",
        "static",
        "go-cgo0",
        "go-cgo1",
        "nolibc",
        "envprobe-glibc",
        "envprobe-musl",
    ],
)
def test_non_targets_behave_exactly_as_without_the_injector(
    program: str, programs: dict[str, Path], injector_payload: Path, tmp_path: Path
) -> None:
    names = ["PYTHONPATH", "NODE_OPTIONS"]
    args = {
        "/bin/true": ["/bin/true"],
        "sh": ["sh", "-c", 'echo "P=$PYTHONPATH N=$NODE_OPTIONS"; ls / >/dev/null; exit 0'],
        "static": [str(programs["static"]), *names],
        "go-cgo0": [str(programs["go-cgo0"])],
        "go-cgo1": [str(programs["go-cgo1"])],
        "nolibc": [str(programs["nolibc"])],
        "envprobe-glibc": [str(programs["glibc"]), *names],
        "envprobe-musl": [str(programs["musl"]), *names],
    }[program]
    env = injected_env(injector_payload, tmp_path, LUMIGO_INJECTOR_DEBUG="true")
    with_injector = run(args, env)
    without = run(args, {k: v for k, v in env.items() if k != "LD_PRELOAD"})
    assert with_injector.returncode == without.returncode == 0
    assert with_injector.stdout == without.stdout
    # debug is on, so the only stderr difference allowed is the injector's own one line saying
    # it left this process alone (static binaries never load it at all)
    extra = [
        ln for ln in with_injector.stderr.splitlines() if ln not in without.stderr.splitlines()
    ]
    ours = "lumigo-injector: not a Python, Node.js or Java process"
    assert all(ln.startswith(ours) for ln in extra)
    if program == "nolibc":  # prove it was really loaded there (and returned at once)
        traced = run(args, {**env, "LD_DEBUG": "libs"})
        assert "calling init: " + str(injector_payload / "injector" / "lumigo_injector.so") in (
            traced.stderr
        )
        assert traced.returncode == 0


@pytest.mark.parametrize("program", ["node-glibc", "true"])
def test_valgrind_reports_no_errors(
    program: str, programs: dict[str, Path], injector_payload: Path, tmp_path: Path
) -> None:
    args = [str(programs["glibc"].parent / "node")] if program == "node-glibc" else ["/bin/true"]
    env = injected_env(injector_payload, tmp_path)
    result = run(["valgrind", "-q", "--error-exitcode=99", "--track-origins=yes", *args], env)
    assert result.returncode == 0, result.stderr
    assert "==" not in result.stderr  # valgrind prints nothing at all in -q mode without errors
    if program == "node-glibc":  # the injecting code path really ran under valgrind
        assert "getenv NODE_OPTIONS=--require" in result.stdout


def test_static_copier_copies_the_payload_exactly(injector_payload: Path, tmp_path: Path) -> None:
    copier = SO_BUILDS / platform.machine() / "lumigo-copy"
    file_type = subprocess.run(["file", "-b", str(copier)], capture_output=True, text=True).stdout
    assert "statically linked" in file_type
    target = tmp_path / "target"
    target.mkdir()
    for _ in range(2):  # a restarted init container copies over its previous run
        result = run([str(copier), str(injector_payload)], {"TARGET_DIRECTORY": str(target)})
        assert result.returncode == 0, result.stderr
    assert_same_tree(injector_payload, target)
    missing = run([str(copier), str(injector_payload)], {})
    assert missing.returncode == 2
    assert "TARGET_DIRECTORY is not set" in missing.stderr


def assert_same_tree(a: Path, b: Path) -> None:
    cmp = filecmp.dircmp(a, b)
    assert cmp.left_only == cmp.right_only == cmp.diff_files == cmp.funny_files == []
    _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
    assert mismatch == errors == []
    for name in cmp.common_files:
        assert (a / name).stat().st_mode == (b / name).stat().st_mode, name
    for sub in cmp.common_dirs:
        assert_same_tree(a / sub, b / sub)
