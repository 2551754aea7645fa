/* SPDX-License-Identifier: Apache-2.0
 * The gpukmod C helper (see gpukmod_helper.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static int neg_errno(void)
{
	return errno ? -errno : -EIO;
}

/* Open a netlink socket on @unit, let the kernel pick our port id, and report it. */
int gk_nl_open(int unit, int rcvbuf, int *fd_out, unsigned int *portid_out)
{
	struct sockaddr_nl addr = { .nl_family = AF_NETLINK };
	socklen_t len = sizeof(addr);
	int fd, err;

	fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, unit);
	if (fd < 0)
		return neg_errno();
	if (rcvbuf > 0 && setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)) < 0)
		goto fail;
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
		goto fail;
	if (getsockname(fd, (struct sockaddr *)&addr, &len) < 0)
		goto fail;
	*fd_out = fd;
	*portid_out = addr.nl_pid;
	return 0;
fail:
	err = neg_errno();
	close(fd);
	return err;
}

/* Send one datagram to the kernel (port 0). */
int gk_nl_send(int fd, const void *buf, size_t len)
{
	struct sockaddr_nl to = { .nl_family = AF_NETLINK };
	ssize_t n;

	do {
		n = sendto(fd, buf, len, 0, (struct sockaddr *)&to, sizeof(to));
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return neg_errno();
	return (size_t)n == len ? 0 : -EMSGSIZE;
}

/* Receive one datagram within @timeout_ms (-1: wait forever). Returns its length,
 * -ETIMEDOUT, -EMSGSIZE if it did not fit @cap, or another negative errno. */
int gk_nl_recv(int fd, void *buf, size_t cap, int timeout_ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	ssize_t n;
	int r;

	do {
		r = poll(&pfd, 1, timeout_ms);
	} while (r < 0 && errno == EINTR);
	if (r < 0)
		return neg_errno();
	if (r == 0)
		return -ETIMEDOUT;
	do {
		n = recv(fd, buf, cap, MSG_TRUNC | MSG_DONTWAIT);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return neg_errno();
	if ((size_t)n > cap)
		return -EMSGSIZE;
	return (int)n;
}

int gk_nl_close(int fd)
{
	return close(fd) < 0 ? neg_errno() : 0;
}

/* finit_module(2) with a parameter string such as "max_block_ms=500". */
int gk_module_load(const char *path, const char *params)
{
	int fd, err = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return neg_errno();
	if (syscall(SYS_finit_module, fd, params ? params : "", 0) < 0)
		err = neg_errno();
	close(fd);
	return err;
}

/* delete_module(2), non-blocking: a module in use answers -EAGAIN/-EWOULDBLOCK at once. */
int gk_module_unload(const char *name)
{
	if (syscall(SYS_delete_module, name, O_NONBLOCK) < 0)
		return neg_errno();
	return 0;
}

/* Read /sys/module/@name/version into @buf (NUL-terminated, newline stripped). */
int gk_module_version(const char *name, char *buf, size_t cap)
{
	char path[256];
	ssize_t n;
	int fd, err = 0;

	if (!cap)
		return -EINVAL;
	if (snprintf(path, sizeof(path), "/sys/module/%s/version", name) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return neg_errno();
	n = read(fd, buf, cap - 1);
	if (n < 0) {
		err = neg_errno();
		n = 0;
	}
	close(fd);
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\0'))
		n--;
	buf[n] = '\0';
	return err;
}
