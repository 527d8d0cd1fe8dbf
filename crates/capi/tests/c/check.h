/*
 * The check macro of the C test programs: CHECK(cond, fmt, ...) prints one line per check
 * ("ok   " or "FAIL " then the description and where), flushed so that a crash does not hide
 * the checks before it; check_summary() prints "PASSED: 0 failure(s)" (what the tests look
 * for) or "FAILED: N failure(s)" and gives the exit status.
 */
#ifndef SOFTRDMA_TEST_CHECK_H
#define SOFTRDMA_TEST_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                              \
	do {                                                          \
		if (cond) {                                           \
			printf("ok   ");                              \
		} else {                                              \
			printf("FAIL ");                              \
			failures++;                                   \
		}                                                     \
		printf(__VA_ARGS__);                                  \
		printf("   [%s:%d]\n", __FILE__, __LINE__);           \
		fflush(stdout);                                       \
	} while (0)

static inline int check_summary(void)
{
	printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
	return failures ? 1 : 0;
}

#endif
