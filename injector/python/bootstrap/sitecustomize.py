# Lumigo injector bootstrap for CPython. lumigo_injector.so puts this directory first on
# PYTHONPATH of Python processes that have a LUMIGO_TRACER_TOKEN, so the interpreter imports this
# file at start-up (site.py imports `sitecustomize`).
#
# It picks the payload built for this interpreter (CPython minor version x libc), appends it to
# sys.path, imports the Lumigo OpenTelemetry distro (which initialises itself on import), and then
# runs the sitecustomize the user would have had without us. Tracing must never break the
# application: an unsupported interpreter, an application that already ships OpenTelemetry, a
# package of the application's environment that the distro would load in a version it does not
# support (checked before anything of ours is imported), or any error while loading the distro
# only means "not traced", said once on stderr.
#
# All tracer traffic goes to LUMIGO_ENDPOINT / LUMIGO_LOGS_ENDPOINT (the telemetry proxy): the
# distro's dependency report, which only ever goes straight to Lumigo's public endpoint, is off
# unless the user sets LUMIGO_REPORT_DEPENDENCIES. And a failed export (proxy down) is one line
# on stderr, never a traceback in the application's output (unless LUMIGO_DEBUG=true).
#
# Written in a syntax that Python 2.7 still parses, because an unversioned `python` may be 2.7.
import os
import sys

SUPPORTED = ((3, 9), (3, 10), (3, 11), (3, 12), (3, 13))
DISTRO = "lumigo_opentelemetry"
# The distro posts a dependency report to a fixed public URL (not LUMIGO_ENDPOINT) unless this is
# "false"; a pod usually cannot reach it, and the report would bypass the proxy if it could.
REPORT_DEPENDENCIES = "LUMIGO_REPORT_DEPENDENCIES"
# Parent of every logger of the OpenTelemetry SDK and exporters (all ours: we stand down when the
# application has OpenTelemetry), and the distro's own logger.
OTEL_LOGGER = "opentelemetry"
DISTRO_LOGGER = "lumigo-opentelemetry"


def _flag(name):
    return os.environ.get(name, "").lower() in ("true", "1")


def _debug(message):
    if _flag("LUMIGO_INJECTOR_DEBUG"):
        sys.stderr.write("lumigo-injector: python: %s\n" % message)


def _not_activated(reason):
    """One line on stderr: the process runs as it would without Lumigo, and says why; and the
    same, once, to the backend (`_report_not_activated`)."""
    sys.stderr.write("lumigo-injector: python: tracing not activated: %s\n" % reason)
    try:
        _report_not_activated(reason)
    except Exception as error:  # reporting is best effort, never the application's problem
        _debug("could not report the stand-down: %s" % error)


def _report_not_activated(reason):
    """A span-less heartbeat: one OTLP/HTTP log record (JSON) to LUMIGO_LOGS_ENDPOINT, the
    telemetry proxy, which adds the pod and its owners, so the backend shows that this process
    runs untraced and why.

    The request is written by hand on a socket (http:// only, as the proxy is), from a daemon
    thread with a 2 s timeout: the application never waits for it, imports nothing heavy for
    it, and a process that exits first simply does not send it. The thread only ever blocks in
    C calls (name lookup, connect, send), which a finalizing interpreter survives."""
    endpoint = os.environ.get("LUMIGO_LOGS_ENDPOINT", "")
    token = os.environ.get("LUMIGO_TRACER_TOKEN", "").strip()
    if sys.version_info[0] < 3 or not endpoint.startswith("http://") or not token:
        return
    hostport, _, path = endpoint[len("http://") :].partition("/")
    host, _, port = hostport.partition(":")
    import json
    import socket
    import threading

    def attribute(key, value):
        return {"key": key, "value": {"stringValue": str(value)}}

    version = ".".join(str(part) for part in sys.version_info[:3])
    resource = [
        attribute("process.runtime.name", "cpython"),
        attribute("process.runtime.version", version),
        attribute("process.pid", os.getpid()),
    ]
    container = os.environ.get("LUMIGO_CONTAINER_NAME")
    if container:
        resource.append(attribute("k8s.container.name", container))
    record = {
        "severityNumber": 13,
        "severityText": "WARN",
        "body": {"stringValue": "tracing not activated: %s" % reason},
        "attributes": [
            attribute("lumigo.injector.runtime", "python"),
            attribute("lumigo.injector.reason", reason),
        ],
    }
    scope = {"scope": {"name": "lumigo-injector"}, "logRecords": [record]}
    payload = {"resourceLogs": [{"resource": {"attributes": resource}, "scopeLogs": [scope]}]}
    body = json.dumps(payload).encode("utf-8")
    head = (
        "POST /%s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        "Authorization: LumigoToken %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        % (path, hostport, token, len(body))
    )
    message = head.encode("latin-1") + body
    address = (host, int(port or 80))

    def send():
        try:
            with socket.create_connection(address, timeout=2) as connection:
                connection.sendall(message)
                connection.recv(64)  # the status line: the proxy has the record
        except Exception as error:
            _debug("stand-down report failed: %s" % error)

    thread = threading.Thread(target=send, name="lumigo-stand-down-report")
    thread.daemon = True
    thread.start()


class _OneLineFormatter(object):
    """Wraps a logging formatter: the exception goes on the message's line, with no traceback."""

    def __init__(self, inner, suffix=""):
        self.inner = inner
        self.suffix = suffix

    def format(self, record):
        import copy

        error = record.exc_info[1] if record.exc_info else None
        plain = copy.copy(record)
        plain.exc_info, plain.exc_text, plain.stack_info = None, None, None
        text = self.inner.format(plain)
        if error is not None:
            text += ": %s: %s" % (type(error).__name__, error)
        return text + self.suffix


class _OncePerMessage(object):
    """A failing export repeats with every batch while the proxy is unreachable: say it once."""

    def __init__(self):
        self.seen = set()

    def filter(self, record):
        key = (record.name, str(record.msg))
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def quiet_export_errors():
    """OpenTelemetry's warnings and errors go to stderr as single lines, each message once,
    instead of propagating to the root logger, whose last-resort handler prints the traceback of
    every failed export into the application's output. Other loggers, the root logger and the
    application's own logging configuration are not touched."""
    import logging

    otel = logging.getLogger(OTEL_LOGGER)
    if otel.handlers:  # configured by someone already: theirs
        return
    handler = logging.StreamHandler()  # stderr
    handler.setLevel(logging.WARNING)
    handler.setFormatter(
        _OneLineFormatter(
            logging.Formatter("lumigo-injector: python: %(name)s: %(message)s"),
            " (repeats are not printed; LUMIGO_DEBUG=true prints all)",
        )
    )
    handler.addFilter(_OncePerMessage())
    otel.addHandler(handler)
    otel.propagate = False


def _no_tracebacks_from_distro_logger():
    """The distro's logger has its own stderr handler: keep its format, drop the tracebacks."""
    import logging

    for handler in logging.getLogger(DISTRO_LOGGER).handlers:
        if not isinstance(handler.formatter, _OneLineFormatter):
            handler.setFormatter(_OneLineFormatter(handler.formatter or logging.Formatter()))


def detect_libc():
    """'glibc' or 'musl': which manylinux / musllinux wheels this interpreter can load."""
    try:
        version = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):
        version = None
    return "glibc" if version and version.startswith("glibc") else "musl"


def payload_dirs(root, version_info, libc, implementation, gil_disabled):
    """The sys.path entries for this interpreter, or (None, reason) when it is not supported."""
    if implementation != "cpython":
        return None, "implementation %s is not supported" % implementation
    minor = tuple(version_info[:2])
    if minor not in SUPPORTED:
        return None, "Python %d.%d is not supported" % minor
    if gil_disabled:
        return None, "free-threaded CPython is not supported"
    abi_dir = os.path.join(root, "cp%d%d-%s" % (minor[0], minor[1], libc))
    if not os.path.isdir(abi_dir):
        return None, "no payload for this interpreter at %s" % abi_dir
    return [abi_dir, os.path.join(root, "common")], None


# Written next to each target's packages by injector/build-payload: for every distribution the
# distro's packages require, the modules it provides and the version constraints on it.
DEPENDENCIES_FILE = "lumigo-dependencies.json"


def _release(version):
    """'5.29.1' -> (5, 29, 1), 'pre' releases sort before the release ('6.0rc1' < '6.0')."""
    import re

    match = re.match(r"v?(\d+(?:\.\d+)*)(.*)$", version.strip().lower())
    if not match:
        return None
    numbers = tuple(int(n) for n in match.group(1).split("."))
    rest = match.group(2).lstrip("._-")
    final = not rest or rest.startswith("post") or rest.startswith("+")
    return numbers, final


def _padded(a, b):
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def satisfies(version, operator, wanted):
    """PEP 440 comparison, enough for the constraints distributions declare (release numbers,
    pre-releases, `==X.*`, `~=`). An unparsable version satisfies everything: unknown is not a
    reason to stand down."""
    if operator == "===":
        return version == wanted
    have = _release(version)
    if have is None:
        return True
    if wanted.endswith(".*"):
        prefix = _release(wanted[:-2])
        if prefix is None:
            return True
        same = have[0][: len(prefix[0])] + (0,) * max(0, len(prefix[0]) - len(have[0])) == prefix[0]
        return same if operator == "==" else not same
    want = _release(wanted)
    if want is None:
        return True
    if operator == "~=":
        floor = want[0][:-1] if len(want[0]) > 1 else want[0]
        return satisfies(version, ">=", wanted) and satisfies(
            version, "==", ".".join(str(n) for n in floor) + ".*"
        )
    a, b = _padded(have[0], want[0])
    if operator == "<" and a == b and not have[1] and want[1]:
        return False  # `<7.0` excludes 7.0's pre-releases (PEP 440)
    key_have, key_want = (a, have[1]), (b, want[1])
    return {
        "==": key_have == key_want,
        "!=": key_have != key_want,
        ">=": key_have >= key_want,
        "<=": key_have <= key_want,
        ">": key_have > key_want,
        "<": key_have < key_want,
    }.get(operator, True)


def _normalized(name):
    import re

    return re.sub(r"[-_.]+", "_", name).lower()


def _listing(directory, cache):
    if directory not in cache:
        try:
            cache[directory] = os.listdir(directory)
        except OSError:
            cache[directory] = []
    return cache[directory]


def _provided_by(module, entries, cache):
    """The first sys.path entry (a directory) that provides `module` ("google.protobuf"), or
    None. Looked up on the file system (listings cached in `cache`): nothing of the application
    is imported."""
    parts = module.split(".")
    for entry in entries:
        parent = os.path.join(entry, *parts[:-1])
        names = _listing(parent, cache)
        last = parts[-1]
        for name in names:
            if (
                name == last
                or name == last + ".py"
                or (name.startswith(last + ".") and name.endswith(".so"))
            ):
                return entry
    return None


def _metadata_version(path):
    """The Version: header of a METADATA / PKG-INFO file, None if unreadable."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():
                    return None
    except (IOError, OSError):
        return None
    return None


def installed_version(entry, distribution, cache=None):
    """The version of `distribution` installed in the directory `entry`, from its .dist-info or
    .egg-info name or metadata; None when it cannot be told."""
    wanted = _normalized(distribution)
    for name in _listing(entry, {} if cache is None else cache):
        stem, dot, suffix = name.rpartition(".")
        if not dot or suffix not in ("dist-info", "egg-info"):
            continue
        dist, _, version = stem.partition("-")
        if _normalized(dist) != wanted:
            continue
        if version:
            return version.split("-")[0]
        info = os.path.join(entry, name)
        if suffix == "dist-info":
            return _metadata_version(os.path.join(info, "METADATA"))
        return _metadata_version(os.path.join(info, "PKG-INFO") if os.path.isdir(info) else info)
    return None


def dependency_conflict(dependencies, entries):
    """The first distribution of the application's environment (the sys.path `entries`) that
    the distro would load instead of its own and whose version it does not support, described;
    None when there is none."""
    cache = {}
    for distribution in sorted(dependencies):
        wanted = dependencies[distribution]
        for module in wanted.get("modules", []):
            entry = _provided_by(module, entries, cache)
            if entry is None:
                continue
            version = installed_version(entry, distribution, cache)
            if version is None:
                break
            requires = wanted.get("requires", [])
            if not all(satisfies(version, op, want) for op, want in requires):
                return "the application's %s %s (in %s) does not satisfy %s%s, which %s need" % (
                    distribution,
                    version,
                    entry,
                    distribution,
                    ",".join(op + want for op, want in requires),
                    ", ".join(wanted.get("required_by", [])) or "the tracer's packages",
                )
            break
    return None


def _read_dependencies(abi_dir):
    import json

    try:
        with open(os.path.join(abi_dir, DEPENDENCIES_FILE)) as f:
            return json.load(f)
    except (IOError, OSError, ValueError):
        return {}


def _forget_our_modules(dirs):
    """After a failed import, modules loaded from the payload leave sys.modules, so that the
    application never finds a half-initialised copy of ours."""
    for name, module in list(sys.modules.items()):
        places = [getattr(module, "__file__", None) or ""]
        places.extend(getattr(module, "__path__", None) or [])
        if any(str(p).startswith(d + os.sep) for p in places for d in dirs):
            del sys.modules[name]


def _app_has_opentelemetry():
    """The application brings its own OpenTelemetry: mixing two SDKs breaks both, stand down."""
    try:
        import importlib.util

        return importlib.util.find_spec("opentelemetry") is not None
    except Exception:
        return True


def _usable_payload(root):
    """(the sys.path entries to add, None), or (None, why this process cannot be traced)."""
    try:
        import sysconfig

        gil_disabled = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    except Exception:
        gil_disabled = False
    implementation = getattr(getattr(sys, "implementation", None), "name", "cpython2")
    dirs, reason = payload_dirs(root, sys.version_info, detect_libc(), implementation, gil_disabled)
    if dirs is None:
        return None, reason
    if _app_has_opentelemetry():
        return None, "the application already has OpenTelemetry"
    app_entries = [e for e in sys.path if e and not e.startswith(root + os.sep)]
    conflict = dependency_conflict(_read_dependencies(dirs[0]), app_entries)
    if conflict:
        return None, conflict
    return dirs, None


def _activate(here):
    if not os.environ.get("LUMIGO_TRACER_TOKEN"):
        _debug("LUMIGO_TRACER_TOKEN is not set; not tracing")
        return
    dirs, reason = _usable_payload(os.path.dirname(here))
    if dirs is None:
        _not_activated(reason)
        return
    # Appended, never prepended: the application's own packages always win.
    sys.path.extend(dirs)
    # /opt/lumigo is mounted read-only: never try to write .pyc files into the payload (and keep
    # a writable copy, like build/payload in tests, identical to what the image ships).
    dont_write = sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    quiet = not _flag("LUMIGO_DEBUG")
    if quiet:
        quiet_export_errors()
    # Set only while the distro initialises (it reads it on import), so the application and its
    # child processes see their environment unchanged.
    defaulted = REPORT_DEPENDENCIES not in os.environ
    if defaulted:
        os.environ[REPORT_DEPENDENCIES] = "false"
    try:
        __import__(DISTRO)
        if quiet:
            _no_tracebacks_from_distro_logger()
        _debug("tracing with %s from %s" % (DISTRO, dirs[0]))
    except Exception as error:  # the distro failed: leave the app as it would be without us
        for entry in dirs:
            while entry in sys.path:
                sys.path.remove(entry)
        _forget_our_modules(dirs)
        _not_activated("%s: %s" % (type(error).__name__, error))
    finally:
        sys.dont_write_bytecode = dont_write
        if defaulted:
            os.environ.pop(REPORT_DEPENDENCIES, None)


def _chain_user_sitecustomize(here):
    """Import the next `sitecustomize` on sys.path, the one this file shadows."""
    ours = sys.modules.get("sitecustomize")
    while here in sys.path:
        sys.path.remove(here)  # also keeps our directory out of the application's sys.path
    del sys.modules["sitecustomize"]
    try:
        __import__("sitecustomize")
    except ImportError as error:
        missing = getattr(error, "name", None) == "sitecustomize" or str(error).endswith(
            "named sitecustomize"
        )
        if not missing:
            raise
        sys.modules["sitecustomize"] = ours


def _main():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        _activate(here)
    except Exception as error:  # never let tracing stop the interpreter
        _debug("bootstrap failed: %s" % error)
    _chain_user_sitecustomize(here)


if __name__ == "sitecustomize":
    _main()
