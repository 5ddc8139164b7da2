/* A user's own LD_PRELOAD library: leaves a mark in the environment when it is loaded. */
#include <stdlib.h>

__attribute__((constructor)) static void user_preload_init(void) {
    setenv("USER_PRELOAD_LOADED", "1", 1);
}
