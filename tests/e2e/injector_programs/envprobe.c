/* Prints variables as seen through getenv() and through environ, one per line:
 *   getenv NAME=VALUE | environ NAME=VALUE   (or NAME unset).
 * The names are the arguments (default: the three the injector deals with). Built with gcc and
 * musl-gcc; a copy named `node` or `python3` is what the injector treats as a runtime. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

static const char *NAMES[] = {"PYTHONPATH", "NODE_OPTIONS", "LD_PRELOAD", NULL};

int main(int argc, char **argv) {
    const char **names = argc > 1 ? (const char **)argv + 1 : NAMES;
    for (const char **name = names; *name; name++) {
        const char *value = getenv(*name);
        if (value)
            printf("getenv %s=%s\n", *name, value);
        else
            printf("getenv %s unset\n", *name);
        size_t n = strlen(*name);
        const char *found = NULL;
        for (char **e = environ; *e; e++)
            if (strncmp(*e, *name, n) == 0 && (*e)[n] == '=') found = *e + n + 1;
        if (found)
            printf("environ %s=%s\n", *name, found);
        else
            printf("environ %s unset\n", *name);
    }
    return 0;
}
