/* Prints the injector's variables as seen through getenv() and through environ, one per line:
 *   getenv NAME=VALUE | environ NAME=VALUE   (or NAME unset). Built with gcc and musl-gcc. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

static const char *NAMES[] = {"PYTHONPATH", "NODE_OPTIONS", "LD_PRELOAD", NULL};

int main(void) {
    for (const char **name = NAMES; *name; name++) {
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
