/* SPDX-License-Identifier: MIT */
/* setup.h - ursa setup / ursa setup --undo (tools/setup.c). */
#ifndef URSA_TOOLS_SETUP_H
#define URSA_TOOLS_SETUP_H

/* lib: the directory of the ursa libraries to install system-wide.
 * argv[0] is "setup"; returns the command's exit status. */
int cmd_setup(const char *lib, int argc, char **argv);

/* In a sanitizer build, the path of the ASan runtime this program runs
 * on (which must come first in a program's preloads); else NULL. */
const char *asan_runtime(void);

#endif
