/*
 * lumigo_injector.so: activates the Lumigo OpenTelemetry distros in Python and Node.js processes,
 * and the OpenTelemetry Java agent in JVMs.
 *
 * Loaded through LD_PRELOAD=/opt/lumigo/injector/lumigo_injector.so. An ELF constructor runs
 * before main() and, only when the process is a CPython or Node.js interpreter, edits the process
 * environment with the libc's own setenv():
 *
 *   python*  PYTHONPATH   = <payload>/python/bootstrap[:<user value>]
 *   node     NODE_OPTIONS = --require <payload>/nodejs/lumigo-bootstrap.js[ <user value>]
 *            NODE_PATH    = [<user value>:]<payload>/nodejs/node_path (with or without a token:
 *                           the app's own require('@lumigo/opentelemetry') resolves)
 *   java     JAVA_TOOL_OPTIONS = [<user value> ]-javaagent:<payload>/java/opentelemetry-javaagent.jar
 *            and, where the user has not set them, the agent's OTEL_* exporter settings: traces
 *            (and logs if LUMIGO_ENABLE_LOGS=true) to LUMIGO_ENDPOINT / LUMIGO_LOGS_ENDPOINT with
 *            `Authorization: LumigoToken <token>`, metrics off. A JVM that already has a
 *            -javaagent (options or command line) keeps its own and gets nothing of ours. The
 *            token goes into OTEL_EXPORTER_OTLP_HEADERS, never into JAVA_TOOL_OPTIONS, which the
 *            JVM prints at start-up.
 *
 * Why setenv at start-up and not a getenv() interposer: CPython copies `environ` into os.environ
 * and Node reads it for process.env, so an edited environment is seen through getenv(), environ
 * and the runtimes alike (the design of the OpenTelemetry injector).
 *
 * Why no libc: the same file must load in glibc and musl processes, so it is linked with
 * -nostdlib and has no DT_NEEDED entry. getenv/setenv (and environ, to execute again with a
 * user's LD_PRELOAD) are WEAK undefined symbols, bound by the dynamic linker to whatever libc the
 * program already uses; in a dynamically linked program without any libc they resolve to NULL
 * and the constructor returns at once. The few system calls it needs (readlinkat, faccessat,
 * openat, read, write, mmap, execve) are made directly. Static binaries never load LD_PRELOAD
 * libraries, so they are never affected.
 *
 * Every other process (shells, coreutils, Go binaries, ...) sees no change at all. The values a
 * user already set are kept: ours are prepended (NODE_PATH: appended), and an entry already
 * present is not added twice (child processes inherit the edited environment). A process that
 * would be traced but cannot be, because the payload is incomplete (no payload.json, which the
 * init container copies last) prints one line on stderr saying so; nothing else is printed
 * unless LUMIGO_INJECTOR_DEBUG=true; no value of LUMIGO_TRACER_TOKEN is ever printed.
 *
 * A user's LD_PRELOAD whose source is optional (a ConfigMap or Secret key that may be missing)
 * is not chained by the webhook with `$(LUMIGO_ORIGINAL_LD_PRELOAD)`: the kubelet leaves an
 * unresolvable reference verbatim and ld.so would print an error in every process. LD_PRELOAD is
 * then ours alone, and when LUMIGO_ORIGINAL_LD_PRELOAD is set this library appends it to
 * LD_PRELOAD and executes the process again (same pid, same arguments and environment), so the
 * user's libraries are preloaded in it and in every child, as if the kubelet had chained them.
 * A `$(...)` entry left in LD_PRELOAD (a workload chained so by an earlier version) is removed
 * for child processes.
 *
 * Thread safety: the constructor runs once, in the loading thread, before main() and before the
 * program can start threads; it uses only stack buffers and no global mutable state.
 */

typedef unsigned long size_t;

extern char *getenv(const char *name) __attribute__((weak));
extern int setenv(const char *name, const char *value, int overwrite) __attribute__((weak));
extern char **environ __attribute__((weak));

#define AT_FDCWD (-100)
#define O_RDONLY_CLOEXEC 02000000 /* O_RDONLY | O_CLOEXEC, the same on x86_64 and aarch64 */
#define EINTR 4
#define R_OK 4
#define PATH_BUF 4096
#define VALUE_BUF 32768
#define DEFAULT_ROOT "/opt/lumigo"
#define SO_SUFFIX "/injector/lumigo_injector.so"
#define PY_BOOTSTRAP "/python/bootstrap"
#define PY_BOOTSTRAP_FILE "/python/bootstrap/sitecustomize.py"
#define NODE_BOOTSTRAP "/nodejs/lumigo-bootstrap.js"
#define NODE_BY_NAME "/nodejs/node_path"
#define JAVA_AGENT "/java/opentelemetry-javaagent.jar"
#define JAVAAGENT_FLAG "-javaagent:"
/* Copied last by the init container (lumigo-copy): without it the payload is incomplete. */
#define COMPLETE_MARKER "/payload.json"
#define ORIGINAL_PRELOAD "LUMIGO_ORIGINAL_LD_PRELOAD"
/* Address space reserved (not committed) for /proc/self/cmdline when executing again. */
#define CMDLINE_MAX (64L << 20)
#define PROT_READ 1
#define PROT_WRITE 2
#define MAP_PRIVATE 0x02
#define MAP_ANONYMOUS 0x20
#define MAP_NORESERVE 0x4000

#if defined(__x86_64__)
#define SYS_read 0
#define SYS_close 3
#define SYS_openat 257
#define SYS_write 1
#define SYS_readlinkat 267
#define SYS_faccessat 269
#define SYS_mmap 9
#define SYS_munmap 11
#define SYS_execve 59
static long sys4(long n, long a, long b, long c, long d) {
    long ret;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
}
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}
#elif defined(__aarch64__)
#define SYS_read 63
#define SYS_close 57
#define SYS_openat 56
#define SYS_write 64
#define SYS_readlinkat 78
#define SYS_faccessat 48
#define SYS_mmap 222
#define SYS_munmap 215
#define SYS_execve 221
static long sys4(long n, long a, long b, long c, long d) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
    return x0;
}
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory");
    return x0;
}
#else
#error "lumigo_injector supports x86_64 and aarch64"
#endif

/* ---- tiny freestanding string helpers (no libc) ---- */

static size_t str_len(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

static int str_eq(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

static int starts_with(const char *s, const char *prefix) {
    while (*prefix)
        if (*s++ != *prefix++) return 0;
    return 1;
}

/* A growing string in a caller-owned buffer; `ok` turns 0 instead of overflowing. */
struct buf {
    char *p;
    size_t len, cap;
    int ok;
};

static void buf_add_n(struct buf *b, const char *s, size_t n) {
    if (!b->ok || n >= b->cap - b->len) {
        b->ok = 0;
        return;
    }
    for (size_t i = 0; i < n; i++) b->p[b->len + i] = s[i];
    b->len += n;
    b->p[b->len] = 0;
}

static void buf_add(struct buf *b, const char *s) { buf_add_n(b, s, str_len(s)); }

/* ---- output: problems always (one line), the rest only with LUMIGO_INJECTOR_DEBUG=true|1 ---- */

static int debug_enabled(void) {
    const char *v = getenv("LUMIGO_INJECTOR_DEBUG");
    return v && (str_eq(v, "true") || str_eq(v, "1") || str_eq(v, "TRUE") || str_eq(v, "True"));
}

/* One line on stderr, always: for what a user must know (tracing was wanted and is not on). */
static void say(const char *a, const char *b) {
    char line[PATH_BUF];
    struct buf out = {line, 0, sizeof line, 1};
    buf_add(&out, "lumigo-injector: ");
    buf_add(&out, a);
    if (b) buf_add(&out, b);
    size_t len = str_len(line);
    if (out.ok && len < sizeof line - 1)
        line[len++] = '\n';
    else
        line[len - 1] = '\n'; /* truncated: keep one line per message */
    sys4(SYS_write, 2, (long)line, (long)len, 0);
}

static void debug(int enabled, const char *a, const char *b) {
    if (enabled) say(a, b);
}

/* ---- what kind of process is this? ---- */

enum kind { OTHER, PYTHON, NODE, JAVA };

/* python, python3, python3.12, python3.13t, python3.11d; node, nodejs; java. By the real
   executable. */
static enum kind classify(const char *base) {
    if (str_eq(base, "node") || str_eq(base, "nodejs")) return NODE;
    if (str_eq(base, "java")) return JAVA;
    if (!starts_with(base, "python")) return OTHER;
    const char *p = base + 6;
    while ((*p >= '0' && *p <= '9') || *p == '.') p++;
    if (*p == 'd' || *p == 't' || *p == 'm') p++;
    return *p == 0 ? PYTHON : OTHER;
}

static const char *base_name(const char *path) {
    const char *base = path;
    for (const char *p = path; *p; p++)
        if (*p == '/') base = p + 1;
    return base;
}

static int readable(const char *path) {
    return sys4(SYS_faccessat, AT_FDCWD, (long)path, R_OK, 0) == 0;
}

/*
 * The payload root is two levels above this library as named in LD_PRELOAD
 * ("<root>/injector/lumigo_injector.so"), so a payload copied anywhere works; /opt/lumigo
 * otherwise (e.g. when loaded through /etc/ld.so.preload).
 */
static void payload_root(struct buf *root) {
    const char *preload = getenv("LD_PRELOAD");
    size_t suffix = str_len(SO_SUFFIX);
    while (preload && *preload) {
        const char *end = preload;
        while (*end && *end != ':' && *end != ' ') end++;
        size_t n = (size_t)(end - preload);
        if (n > suffix && preload[0] == '/') {
            const char *tail = end - suffix;
            size_t i = 0;
            while (i < suffix && tail[i] == SO_SUFFIX[i]) i++;
            if (i == suffix) {
                buf_add_n(root, preload, n - suffix);
                return;
            }
        }
        preload = *end ? end + 1 : end;
    }
    buf_add(root, DEFAULT_ROOT);
}

/* Is `entry` one of the `sep`-separated items of `list`? */
static int list_has(const char *list, const char *entry, char sep) {
    size_t n = str_len(entry);
    const char *p = list;
    while (*p) {
        while (*p == sep) p++;
        const char *end = p;
        while (*end && *end != sep) end++;
        if ((size_t)(end - p) == n) {
            size_t i = 0;
            while (i < n && p[i] == entry[i]) i++;
            if (i == n) return 1;
        }
        p = end;
    }
    return 0;
}

/* NODE_OPTIONS splits on spaces; quote a path that has spaces, quotes or backslashes. */
static void add_node_path(struct buf *b, const char *path) {
    int plain = 1;
    for (const char *p = path; *p; p++)
        if (*p == ' ' || *p == '\t' || *p == '"' || *p == '\\' || *p == '\'') plain = 0;
    if (plain) {
        buf_add(b, path);
        return;
    }
    buf_add_n(b, "\"", 1);
    for (const char *p = path; *p; p++) {
        if (*p == '"' || *p == '\\') buf_add_n(b, "\\", 1);
        buf_add_n(b, p, 1);
    }
    buf_add_n(b, "\"", 1);
}

/*
 * Put `dir` into the ':'-separated list in variable `name` (messages start with `who`): first
 * (ours wins: PYTHONPATH) or last (the user's entries win: NODE_PATH). Left as it is when `dir`
 * is already there (a child process) or when the result would not fit.
 */
static void add_to_path_list(int dbg, const char *who, const char *name, const char *dir,
                             int first) {
    char value[VALUE_BUF], what[PATH_BUF];
    struct buf v = {value, 0, sizeof value, 1}, w = {what, 0, sizeof what, 1};
    buf_add(&w, who);
    buf_add(&w, name);
    const char *old = getenv(name);
    if (old && list_has(old, dir, ':')) {
        debug(dbg, what, " already set up");
        return;
    }
    if (first) buf_add(&v, dir);
    if (old && *old) {
        if (first) buf_add_n(&v, ":", 1);
        buf_add(&v, old);
        if (!first) buf_add_n(&v, ":", 1);
    }
    if (!first) buf_add(&v, dir);
    if (!v.ok) {
        debug(dbg, what, " too long, left unchanged");
        return;
    }
    buf_add_n(&w, "=", 1);
    if (setenv(name, value, 1) == 0) debug(dbg, what, value);
}

/* <root><rel> into `b`; 1 when it fits and the payload has it (readable). */
static int payload_path(struct buf *b, const char *root, const char *rel) {
    buf_add(b, root);
    buf_add(b, rel);
    return b->ok && readable(b->p);
}

static void inject_python(int dbg, const char *root) {
    char file[PATH_BUF], dir[PATH_BUF];
    struct buf f = {file, 0, sizeof file, 1}, d = {dir, 0, sizeof dir, 1};
    if (!payload_path(&f, root, PY_BOOTSTRAP_FILE) || !payload_path(&d, root, PY_BOOTSTRAP)) {
        debug(dbg, "python: no payload at ", root);
        return;
    }
    add_to_path_list(dbg, "python: ", "PYTHONPATH", dir, 1);
}

/*
 * <payload>/nodejs/node_path holds one package, @lumigo/opentelemetry, which is the distro the
 * bootstrap started: with it last on NODE_PATH an application's own require of the distro by
 * name resolves (to the same instance: one tracer), while a copy in the application's
 * node_modules, or on the user's NODE_PATH entries, still comes first. Set even without a token,
 * so that such an application starts (untraced) rather than failing with `Cannot find module`.
 */
static void inject_node_path(int dbg, const char *root) {
    char dir[PATH_BUF];
    struct buf d = {dir, 0, sizeof dir, 1};
    if (!payload_path(&d, root, NODE_BY_NAME)) {
        debug(dbg, "node: no distro to resolve by name at ", root);
        return;
    }
    add_to_path_list(dbg, "node: ", "NODE_PATH", dir, 0);
}

static void inject_node(int dbg, const char *root) {
    char file[PATH_BUF], quoted[PATH_BUF], value[VALUE_BUF];
    struct buf f = {file, 0, sizeof file, 1}, q = {quoted, 0, sizeof quoted, 1};
    if (!payload_path(&f, root, NODE_BOOTSTRAP)) {
        debug(dbg, "node: no payload at ", root);
        return;
    }
    add_node_path(&q, file);
    const char *old = getenv("NODE_OPTIONS");
    if (old && list_has(old, quoted, ' ')) {
        debug(dbg, "node: NODE_OPTIONS already set up", 0);
        return;
    }
    struct buf v = {value, 0, sizeof value, 1};
    buf_add(&v, "--require ");
    buf_add(&v, quoted);
    if (old && *old) {
        buf_add_n(&v, " ", 1);
        buf_add(&v, old);
    }
    if (!q.ok || !v.ok) {
        debug(dbg, "node: NODE_OPTIONS too long, left unchanged", 0);
        return;
    }
    if (setenv("NODE_OPTIONS", value, 1) == 0) debug(dbg, "node: NODE_OPTIONS=", value);
}

static int contains(const char *s, const char *needle) {
    for (; s && *s; s++)
        if (starts_with(s, needle)) return 1;
    return 0;
}

/*
 * Any argument of this process's command line that starts with `prefix`? All of
 * /proc/self/cmdline is read, however long (a JVM's classpath alone can be hundreds of KiB
 * before its -javaagent; the kernel bounds the whole at ARG_MAX): it streams through a small
 * buffer and the start of each argument is matched as it goes by, so an argument split across
 * two reads is matched like any other and no buffer size limits how far an argument may be.
 */
static int cmdline_has(const char *prefix) {
    char chunk[4096];
    long fd = sys4(SYS_openat, AT_FDCWD, (long)"/proc/self/cmdline", O_RDONLY_CLOEXEC, 0);
    if (fd < 0) return 0;
    size_t matched = 0; /* the current argument starts with that many characters of prefix */
    int candidate = 1;  /* ... and may still start with all of it */
    int found = 0;
    while (!found) {
        long n = sys4(SYS_read, fd, (long)chunk, (long)sizeof chunk, 0);
        if (n == -EINTR) continue;
        if (n <= 0) break; /* the end, or an error: what was read is all there is to go by */
        for (long i = 0; i < n && !found; i++) {
            if (chunk[i] == 0) {
                matched = 0, candidate = 1;
            } else if (candidate) {
                candidate = chunk[i] == prefix[matched];
                found = candidate && prefix[++matched] == 0;
            }
        }
    }
    sys4(SYS_close, fd, 0, 0, 0);
    return found;
}

/* Only what an HTTP header value may hold unquoted, and no ',' or '=' (the OTLP headers list). */
static int token_is_plain(const char *token) {
    for (const char *p = token; *p; p++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

static void set_default(int dbg, const char *name, const char *value) {
    if (getenv(name)) {
        debug(dbg, "java: kept the user's ", name);
        return;
    }
    setenv(name, value, 0);
}

static void inject_java(int dbg, const char *root, const char *token) {
    char file[PATH_BUF], value[VALUE_BUF], headers[PATH_BUF];
    struct buf f = {file, 0, sizeof file, 1};
    if (!payload_path(&f, root, JAVA_AGENT)) {
        debug(dbg, "java: no payload at ", root);
        return;
    }
    if (contains(file, " ") || contains(file, "\t")) {
        debug(dbg, "java: payload path has a space (JAVA_TOOL_OPTIONS splits on it): ", file);
        return;
    }
    const char *old = getenv("JAVA_TOOL_OPTIONS");
    if (contains(old, JAVAAGENT_FLAG) || contains(getenv("JDK_JAVA_OPTIONS"), JAVAAGENT_FLAG) ||
        contains(getenv("_JAVA_OPTIONS"), JAVAAGENT_FLAG) || cmdline_has(JAVAAGENT_FLAG)) {
        debug(dbg, "java: the JVM already has a -javaagent; left as it is", 0);
        return;
    }
    if (!token_is_plain(token)) {
        debug(dbg, "java: LUMIGO_TRACER_TOKEN has characters a header cannot carry; not traced", 0);
        return;
    }
    struct buf v = {value, 0, sizeof value, 1}, h = {headers, 0, sizeof headers, 1};
    if (old && *old) {
        buf_add(&v, old);
        buf_add_n(&v, " ", 1);
    }
    buf_add(&v, JAVAAGENT_FLAG);
    buf_add(&v, file);
    buf_add(&h, "Authorization=LumigoToken%20");
    buf_add(&h, token);
    if (!v.ok || !h.ok) {
        debug(dbg, "java: JAVA_TOOL_OPTIONS too long, left unchanged", 0);
        return;
    }
    const char *traces = getenv("LUMIGO_ENDPOINT");
    const char *logs = getenv("LUMIGO_LOGS_ENDPOINT");
    const char *enable_traces = getenv("LUMIGO_ENABLE_TRACES");
    const char *enable_logs = getenv("LUMIGO_ENABLE_LOGS");
    set_default(dbg, "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
    set_default(dbg, "OTEL_EXPORTER_OTLP_HEADERS", headers);
    if (traces && *traces) set_default(dbg, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", traces);
    if (logs && *logs) set_default(dbg, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", logs);
    set_default(dbg, "OTEL_TRACES_EXPORTER",
                enable_traces && str_eq(enable_traces, "false") ? "none" : "otlp");
    set_default(dbg, "OTEL_LOGS_EXPORTER",
                enable_logs && str_eq(enable_logs, "true") ? "otlp" : "none");
    set_default(dbg, "OTEL_METRICS_EXPORTER", "none");
    if (setenv("JAVA_TOOL_OPTIONS", value, 1) == 0) debug(dbg, "java: JAVA_TOOL_OPTIONS=", value);
}

/* ---- LD_PRELOAD: no `$(...)` entry, and the user's original from an optional source ---- */

static int is_error(long ret) { return (unsigned long)ret > (unsigned long)-4096L; }

static void *map(long size) {
    long p = sys6(SYS_mmap, 0, size, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return is_error(p) ? 0 : (void *)p;
}

/* Drop the entries the kubelet left as an unresolved `$(VAR)` reference, for child processes
   (ld.so of this process has already tried them). */
static void drop_unresolved(int dbg) {
    const char *preload = getenv("LD_PRELOAD");
    if (!preload || !contains(preload, "$(")) return;
    char value[VALUE_BUF];
    struct buf v = {value, 0, sizeof value, 1};
    const char *p = preload;
    while (*p) {
        const char *end = p;
        while (*end && *end != ':' && *end != ' ') end++;
        if (end > p && !starts_with(p, "$(")) {
            if (v.len) buf_add_n(&v, ":", 1);
            buf_add_n(&v, p, (size_t)(end - p));
        }
        p = *end ? end + 1 : end;
    }
    if (v.ok && setenv("LD_PRELOAD", value, 1) == 0) debug(dbg, "LD_PRELOAD without $(...): ", value);
}

/* Execute this process again with the current environment: same pid, same arguments. Returns
   only if it could not. */
static void execute_again(void) {
    if (!environ) return;
    char *args = map(CMDLINE_MAX);
    if (!args) return;
    long fd = sys4(SYS_openat, AT_FDCWD, (long)"/proc/self/cmdline", 0 /* O_RDONLY */, 0);
    long n = 0, r = -1;
    if (fd >= 0) {
        while (n < CMDLINE_MAX - 1) {
            r = sys4(SYS_read, fd, (long)(args + n), CMDLINE_MAX - 1 - n, 0);
            if (r == -4 /* EINTR */) continue;
            if (r <= 0) break;
            n += r;
        }
        sys4(SYS_close, fd, 0, 0, 0);
    }
    if (r == 0 && n > 0) { /* the whole command line, up to its end */
        args[n] = 0;
        long count = 0;
        for (long i = 0; i < n; i += (long)str_len(args + i) + 1) count++;
        char **argv = map((count + 1) * (long)sizeof(char *));
        if (argv) {
            long k = 0;
            for (long i = 0; i < n; i += (long)str_len(args + i) + 1) argv[k++] = args + i;
            argv[k] = 0;
            sys4(SYS_execve, (long)"/proc/self/exe", (long)argv, (long)environ, 0);
            sys4(SYS_munmap, (long)argv, (count + 1) * (long)sizeof(char *), 0, 0);
        }
    }
    sys4(SYS_munmap, (long)args, CMDLINE_MAX, 0, 0);
}

/* The webhook keeps a user's LD_PRELOAD from an optional source as LUMIGO_ORIGINAL_LD_PRELOAD
   and leaves it out of LD_PRELOAD; when it is set, preload it here and in every child. */
static void chain_original(int dbg) {
    const char *original = getenv(ORIGINAL_PRELOAD);
    const char *preload = getenv("LD_PRELOAD");
    if (!original || !*original || !preload) return;
    size_t n = str_len(preload), m = str_len(original);
    if (n > m && preload[n - m - 1] == ':' && str_eq(preload + n - m, original)) return; /* done */
    char value[VALUE_BUF];
    struct buf v = {value, 0, sizeof value, 1};
    buf_add(&v, preload);
    buf_add_n(&v, ":", 1);
    buf_add(&v, original);
    if (!v.ok) {
        say(ORIGINAL_PRELOAD " is too long; the user's LD_PRELOAD is not applied", 0);
        return;
    }
    if (setenv("LD_PRELOAD", value, 1) != 0) return;
    debug(dbg, "executing again with LD_PRELOAD=", value);
    execute_again();
    say("could not execute again with the user's LD_PRELOAD (" ORIGINAL_PRELOAD
        "); it applies to child processes only",
        0);
}

__attribute__((constructor)) static void lumigo_injector_init(void) {
    /* No libc in this process (or one without these symbols): do nothing at all. */
    if (!getenv || !setenv) return;

    int dbg = debug_enabled();
    drop_unresolved(dbg);
    chain_original(dbg);
    char exe[PATH_BUF];
    long n = sys4(SYS_readlinkat, AT_FDCWD, (long)"/proc/self/exe", (long)exe, (long)(sizeof exe - 1));
    if (n <= 0) {
        debug(dbg, "cannot read /proc/self/exe; nothing done", 0);
        return;
    }
    exe[n] = 0;
    enum kind kind = classify(base_name(exe));
    if (kind == OTHER) {
        debug(dbg, "not a Python, Node.js or Java process: ", exe);
        return;
    }
    const char *token = getenv("LUMIGO_TRACER_TOKEN");
    int traced = token && *token;
    if (!traced) debug(dbg, "LUMIGO_TRACER_TOKEN is not set; tracing not activated in ", exe);
    if (!traced && kind != NODE) return;
    char root_buf[PATH_BUF];
    struct buf root = {root_buf, 0, sizeof root_buf, 1};
    payload_root(&root);
    if (!root.ok) return;
    char marker[PATH_BUF];
    struct buf m = {marker, 0, sizeof marker, 1};
    buf_add(&m, root_buf);
    buf_add(&m, COMPLETE_MARKER);
    if ((!m.ok || !readable(marker)) && !traced) return;
    if (!m.ok || !readable(marker)) {
        const char *who = kind == PYTHON ? "python: " : kind == NODE ? "node: " : "java: ";
        char what[PATH_BUF];
        struct buf w = {what, 0, sizeof what, 1};
        buf_add(&w, who);
        buf_add(&w, "tracing not activated: the payload is incomplete or missing at ");
        say(what, root_buf);
        return;
    }
    if (kind == NODE) inject_node_path(dbg, root_buf);
    if (!traced) return;
    if (kind == PYTHON)
        inject_python(dbg, root_buf);
    else if (kind == NODE)
        inject_node(dbg, root_buf);
    else
        inject_java(dbg, root_buf, token);
}
