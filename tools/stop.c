/*
 * SIGINT and SIGTERM as a request to stop, for the commands that loop (`stat --watch`,
 * `exporter`): the signals are blocked except while the loop waits in ppoll under the mask
 * tool_catch_stop returns, so none is lost between the loop's check of tool_stop and its wait.
 */
#include <errno.h>
#include <signal.h>

#include "cmd_common.h"

volatile sig_atomic_t tool_stop;

/* Note the request; the loop ends at its next wait. */
static void on_signal(int sig)
{
	(void)sig;
	tool_stop = 1;
}

int tool_catch_stop(sigset_t *waitmask)
{
	struct sigaction sa = {.sa_handler = on_signal};
	sigset_t set;

	sigemptyset(&sa.sa_mask);
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	if (sigprocmask(SIG_BLOCK, &set, waitmask) < 0)
		return -errno;
	sigdelset(waitmask, SIGINT);
	sigdelset(waitmask, SIGTERM);
	/* Installed even where the shell ignores SIGINT (a background job): the loop must stop. */
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0)
		return -errno;
	return 0;
}
