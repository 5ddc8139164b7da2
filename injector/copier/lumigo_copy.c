/*
 * lumigo-copy: the autotrace image's entrypoint. Copies the payload tree (default /payload) into
 * $TARGET_DIRECTORY (the emptyDir the app containers mount read-only at /opt/lumigo).
 *
 * Why a program and not `cp -a`: the final image is FROM scratch (no shell, no coreutils), so this
 * is linked statically (musl-gcc -static). It copies regular files, directories and symbolic
 * links, and exits non-zero with a message naming the path on any error.
 *
 * It runs as the non-root UID/GID the webhook sets (the pod's fsGroup, else 1234), with no
 * capabilities, and the application containers run as yet another UID. So:
 * - the target directory itself is the volume's root, which the kubelet creates owned by root
 *   (0777, or root:<fsGroup> 2777 with an fsGroup): it is used as it is, never chmod'ed (only its
 *   owner or CAP_FOWNER could);
 * - what it creates gets modes any UID can use, whatever the image's or the source's modes and
 *   the container's umask: directories 0755, files 0644, or 0755 when executable by anyone;
 * - a restarted init container (the emptyDir survives a pod restart) runs over its own leftovers:
 *   files and links are replaced (unlinked first, so a leftover's mode never matters), directories
 *   it owns are reused.
 *
 * Tracing must never keep the application from starting: when a copy fails (a full volume, an
 * unreadable file, a directory whose listing fails part-way), it says so and exits 0, leaving the payload marked incomplete. The marker is
 * payload.json, copied last and removed first: lumigo_injector.so activates nothing without it
 * and says why on the application's stderr. injector/ is copied first, so that the library that
 * says it is there even when little else fits.
 *
 * Usage: lumigo-copy [SOURCE]     (TARGET_DIRECTORY must be set)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIR_MODE 0755
#define FILE_MODE 0644
#define EXEC_MODE 0755

static unsigned long files_copied, bytes_copied;

static int fail(const char *what, const char *path) {
    fprintf(stderr, "lumigo-copy: %s %s: %s\n", what, path, strerror(errno));
    return -1;
}

/* Remove a leftover of a previous run at path (a file or a link), if any. */
static int remove_leftover(const char *path) {
    if (unlink(path) == 0 || errno == ENOENT) return 0;
    return fail("cannot replace", path);
}

/* A file is written under a temporary name and renamed when complete: a full volume never leaves
 * a truncated file under its real name (a truncated lumigo_injector.so would crash every process
 * that preloads it). */
static int copy_file(const char *src, const char *dst, mode_t src_mode) {
    mode_t mode = (src_mode & 0111) ? EXEC_MODE : FILE_MODE;
    char partial[PATH_MAX];
    if (snprintf(partial, sizeof partial, "%s.lumigo-partial", dst) >= (int)sizeof partial) {
        errno = ENAMETOOLONG;
        return fail("path too long", dst);
    }
    if (remove_leftover(dst) != 0 || remove_leftover(partial) != 0) return -1;
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return fail("cannot open", src);
    int out = open(partial, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (out < 0) {
        close(in);
        return fail("cannot create", dst);
    }
    char buf[1 << 16];
    ssize_t n;
    int rc = 0;
    while ((n = read(in, buf, sizeof buf)) != 0) {
        if (n < 0) {
            if (errno == EINTR) continue;
            rc = fail("cannot read", src);
            break;
        }
        for (ssize_t done = 0; done < n;) {
            ssize_t w = write(out, buf + done, (size_t)(n - done));
            if (w < 0) {
                if (errno == EINTR) continue;
                rc = fail("cannot write", dst);
                break;
            }
            done += w;
        }
        if (rc) break;
        bytes_copied += (unsigned long)n;
    }
    if (close(out) != 0 && rc == 0) rc = fail("cannot close", dst);
    close(in);
    if (rc == 0 && rename(partial, dst) != 0) rc = fail("cannot rename to", dst);
    if (rc != 0) unlink(partial);
    files_copied += rc == 0;
    return rc;
}

static int copy_link(const char *src, const char *dst) {
    char target[PATH_MAX];
    ssize_t n = readlink(src, target, sizeof target - 1);
    if (n < 0) return fail("cannot read link", src);
    target[n] = 0;
    if (remove_leftover(dst) != 0) return -1;
    if (symlink(target, dst) != 0) return fail("cannot create link", dst);
    return 0;
}

/* A directory at path, DIR_MODE if this process owns it; a directory owned by someone else (the
 * volume's root) is used as it is. */
static int make_dir(const char *path) {
    if (mkdir(path, DIR_MODE) == 0) return 0;
    if (errno != EEXIST) return fail("cannot create directory", path);
    struct stat st;
    if (lstat(path, &st) != 0) return fail("cannot stat", path);
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return fail("cannot create directory", path);
    }
    if (st.st_uid == geteuid() && (st.st_mode & 0777) != DIR_MODE && chmod(path, DIR_MODE) != 0)
        return fail("cannot chmod", path);
    return 0;
}

#define MARKER "payload.json"
#define FIRST "injector"

static int copy_tree(const char *src, const char *dst);

static int join(char *out, size_t size, const char *dir, const char *name) {
    if (snprintf(out, size, "%s/%s", dir, name) < (int)size) return 0;
    errno = ENAMETOOLONG;
    return fail("path too long under", dir);
}

/* The next entry of dir (listing path) but . and ..; NULL at its end, and on an error, which sets
 * *rc: a listing that fails part-way (EIO from a failing disk) is not a shorter directory, and
 * must leave the payload incomplete rather than marked complete without the rest. */
static struct dirent *next_entry(DIR *dir, const char *path, int *rc) {
    for (;;) {
        errno = 0;
        struct dirent *entry = readdir(dir);
        if (!entry) {
            if (errno != 0) *rc = fail("cannot read directory", path);
            return NULL;
        }
        if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0) return entry;
    }
}

/* The payload's top level: injector/ first, payload.json last, after everything else. */
static int copy_payload(const char *src, const char *dst) {
    char s[PATH_MAX], d[PATH_MAX];
    if (join(d, sizeof d, dst, MARKER) != 0) return -1;
    if (remove_leftover(d) != 0) return -1;
    if (join(s, sizeof s, src, FIRST) != 0 || join(d, sizeof d, dst, FIRST) != 0) return -1;
    if (copy_tree(s, d) != 0) return -1;
    DIR *dir = opendir(src);
    if (!dir) return fail("cannot open directory", src);
    struct dirent *entry;
    int rc = 0;
    while (rc == 0 && (entry = next_entry(dir, src, &rc)) != NULL) {
        const char *name = entry->d_name;
        if (!strcmp(name, FIRST) || !strcmp(name, MARKER)) continue;
        rc = join(s, sizeof s, src, name) || join(d, sizeof d, dst, name) || copy_tree(s, d);
    }
    closedir(dir);
    if (rc != 0) return -1;
    if (join(s, sizeof s, src, MARKER) != 0 || join(d, sizeof d, dst, MARKER) != 0) return -1;
    return copy_tree(s, d);
}

static int copy_tree(const char *src, const char *dst) {
    struct stat st;
    if (lstat(src, &st) != 0) return fail("cannot stat", src);
    if (S_ISLNK(st.st_mode)) return copy_link(src, dst);
    if (S_ISREG(st.st_mode)) return copy_file(src, dst, st.st_mode);
    if (!S_ISDIR(st.st_mode)) return 0; /* no devices, sockets or fifos in a payload */
    if (make_dir(dst) != 0) return -1;
    DIR *dir = opendir(src);
    if (!dir) return fail("cannot open directory", src);
    struct dirent *entry;
    int rc = 0;
    char s[PATH_MAX], d[PATH_MAX];
    while (rc == 0 && (entry = next_entry(dir, src, &rc)) != NULL) {
        if (snprintf(s, sizeof s, "%s/%s", src, entry->d_name) >= (int)sizeof s ||
            snprintf(d, sizeof d, "%s/%s", dst, entry->d_name) >= (int)sizeof d) {
            errno = ENAMETOOLONG;
            rc = fail("path too long under", src);
            break;
        }
        rc = copy_tree(s, d);
    }
    closedir(dir);
    return rc;
}

int main(int argc, char **argv) {
    const char *src = argc > 1 ? argv[1] : "/payload";
    const char *dst = getenv("TARGET_DIRECTORY");
    if (!dst || !*dst) {
        fprintf(stderr, "lumigo-copy: TARGET_DIRECTORY is not set\n");
        return 2;
    }
    umask(022); /* the modes above are exact whatever umask the container runtime gave us */
    if (make_dir(dst) != 0 || copy_payload(src, dst) != 0) {
        fprintf(stderr,
                "lumigo-copy: the payload in %s is incomplete: this pod's containers start "
                "without Lumigo tracing\n",
                dst);
        return 0;
    }
    printf("lumigo-copy: copied %lu files (%lu bytes) from %s to %s\n", files_copied, bytes_copied,
           src, dst);
    return 0;
}
