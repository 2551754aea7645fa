// SPDX-License-Identifier: GPL-2.0
/*
 * gpukmod - tell user space, within milliseconds, that a watched container
 * touched its GPU again (gpushare design.md sections 6 and 7).
 *
 * An ftrace hook on __x64_sys_ioctl (and __ia32_compat_sys_ioctl, for 32-bit
 * callers, where the kernel has it) looks at ioctls whose _IOC_TYPE is 0x46
 * (the GPU drivers' ioctl type) from tasks outside the initial pid namespace.
 * When the task's pid namespace is in the table with detection armed, the
 * first such ioctl sends one notice (the u64 namespace inode) to the
 * registered netlink listener and holds that ioctl, and every other GPU ioctl
 * from the namespace, until user space says "release" or max_block_ms passes.
 * Then the original system call runs.
 *
 * The command language on netlink unit nl_unit (default 31) is documented in
 * docs/gpukmod.md and mirrored by gpukmod/protocol.py.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/atomic.h>
#include <linux/capability.h>
#include <linux/ctype.h>
#include <linux/errno.h>
#include <linux/ftrace.h>
#include <linux/ioctl.h>
#include <linux/jiffies.h>
#include <linux/kernel.h>
#include <linux/kprobes.h>
#include <linux/module.h>
#include <linux/netlink.h>
#include <linux/pid_namespace.h>
#include <linux/ptrace.h>
#include <linux/rcupdate.h>
#include <linux/sched.h>
#include <linux/skbuff.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/uaccess.h>
#include <linux/wait.h>
#include <net/net_namespace.h>
#include <net/netlink.h>
#include <net/sock.h>

#ifndef GPUKMOD_VERSION
#define GPUKMOD_VERSION "0.0.0-unset"
#endif

#define GK_IOC_TYPE		0x46
#define GK_MSG_CMD		0x10	/* NLMSG_MIN_TYPE: netlink_rcv_skb hands it to us */
#define GK_MSG_NOTICE		0x11
#define GK_MAX_IDS		64
#define GK_MAX_CMD_LEN		1024
#define GK_TABLE_SIZE		256
#define GK_MAX_BLOCK_MS_LIMIT	600000
#define GK_ENDBR64		0xfa1e0ff3U	/* f3 0f 1e fa, little endian */

/*
 * 31 is the unit design.md names; it is the highest unit below MAX_LINKS and
 * unused by the kernel itself. A parameter, so a clash can be worked around.
 */
static int nl_unit = 31;
module_param(nl_unit, int, 0444);
MODULE_PARM_DESC(nl_unit, "Netlink protocol number to listen on (default 31)");

/*
 * 3000 ms is the seed system's fixed stall: the longest an owner should ever
 * wait if user space does not answer. With a live agent the hold ends when it
 * sends "release", usually far sooner.
 */
static unsigned int max_block_ms = 3000;
module_param(max_block_ms, uint, 0444);
MODULE_PARM_DESC(max_block_ms,
		 "Longest time in ms a watched GPU ioctl is held waiting for release (default 3000, 1..600000)");

/*
 * When the listener's socket closes nobody is left to send "release": end its
 * holds at once rather than stall the owners for max_block_ms. Off only to
 * test unloading with a task still held.
 */
static bool release_on_close = true;
module_param(release_on_close, bool, 0444);
MODULE_PARM_DESC(release_on_close,
		 "End all holds when the registered listener's socket closes (default Y)");

enum gk_state {
	GK_FREE = 0,	/* slot unused */
	GK_WATCHED,	/* added; ioctls pass */
	GK_ARMED,	/* detect: the next GPU ioctl sends a notice and is held */
	GK_HOLDING,	/* notice sent; GPU ioctls wait for release or the deadline */
};

/**
 * struct gk_entry - one watched pid namespace
 * @inum: the namespace's inode number (ns_common.inum)
 * @state: where it is in enum gk_state
 * @gen: hold generation; a waiter only ends the hold it started waiting on
 * @deadline: jiffies at which a hold ends without release
 */
struct gk_entry {
	u32 inum;
	enum gk_state state;
	u64 gen;
	unsigned long deadline;
};

/* The bare verbs (no ids) come first, up to GK_ADD; the others take ids. */
enum gk_verb {
	GK_REGISTER,
	GK_FLUSH,
	GK_ADD,
	GK_DELETE,
	GK_DETECT,
	GK_UNDETECT,
	GK_RELEASE,
	GK_NR_VERBS,
};

static const char *const gk_verb_names[GK_NR_VERBS] = {
	[GK_REGISTER] = "Register",
	[GK_FLUSH] = "Flush",
	[GK_ADD] = "add",
	[GK_DELETE] = "delete",
	[GK_DETECT] = "detect",
	[GK_UNDETECT] = "undetect",
	[GK_RELEASE] = "release",
};

/**
 * struct gk_cmd - a parsed netlink command
 * @verb: what to do
 * @n: how many ids follow (0 for Register and Flush)
 * @ids: pid namespace inodes, each nonzero and distinct
 */
struct gk_cmd {
	enum gk_verb verb;
	unsigned int n;
	u32 ids[GK_MAX_IDS];
};

/* Everything below gk_lock protects: the table, the listener, the flags. */
static DEFINE_SPINLOCK(gk_lock);
static struct gk_entry gk_table[GK_TABLE_SIZE];
static unsigned int gk_nr_armed;	/* entries ARMED or HOLDING: the fast-path check */
static u64 gk_next_gen;
static u32 gk_listener;			/* portid of the registered listener, 0 = none */
static bool gk_exiting;

static DECLARE_WAIT_QUEUE_HEAD(gk_wq);
static atomic_t gk_inflight = ATOMIC_INIT(0);
static struct sock *gk_nl;

static asmlinkage long gk_sys_ioctl(const struct pt_regs *regs);
static asmlinkage long gk_compat_sys_ioctl(const struct pt_regs *regs);

/**
 * struct gk_hook - one hooked ioctl entry point
 * @name: the system call wrapper's symbol
 * @compat: 32-bit entry: the command is in regs->cx, not regs->si
 * @required: load fails without it (the 64-bit entry); otherwise it is skipped
 * @wrapper: where a watched call is diverted
 * @fentry: the address ftrace reports as ip for it (0: not hooked)
 * @orig: its true start, ENDBR included
 */
struct gk_hook {
	const char *name;
	bool compat;
	bool required;
	long (*wrapper)(const struct pt_regs *regs);
	unsigned long fentry;
	long (*orig)(const struct pt_regs *regs);
};

static struct gk_hook gk_hooks[] = {
	{ .name = "__x64_sys_ioctl", .required = true, .wrapper = gk_sys_ioctl },
	{ .name = "__ia32_compat_sys_ioctl", .compat = true, .wrapper = gk_compat_sys_ioctl },
};

static struct gk_entry *gk_find(u32 inum)
{
	int i;

	for (i = 0; i < GK_TABLE_SIZE; i++)
		if (gk_table[i].state != GK_FREE && gk_table[i].inum == inum)
			return &gk_table[i];
	return NULL;
}

static bool gk_is_armed(enum gk_state state)
{
	return state == GK_ARMED || state == GK_HOLDING;
}

/* Caller holds gk_lock. Keeps gk_nr_armed in step with the table. */
static void gk_set_state(struct gk_entry *e, enum gk_state state)
{
	if (gk_is_armed(e->state) && !gk_is_armed(state))
		gk_nr_armed--;
	else if (!gk_is_armed(e->state) && gk_is_armed(state))
		gk_nr_armed++;
	e->state = state;
}

static u32 gk_current_pidns(void)
{
	struct pid_namespace *ns = task_active_pid_ns(current);

	if (!ns || ns == &init_pid_ns)
		return 0;
	return ns->ns.inum;
}

/**
 * gk_send_notice() - unicast one notice to the registered listener
 * @inum: the pid namespace inode that touched its GPU
 *
 * Returns: 0 or a negative errno (-ENOTCONN without a listener).
 */
static int gk_send_notice(u32 inum)
{
	struct nlmsghdr *nlh;
	struct sk_buff *skb;
	u64 val = inum;
	u32 portid;
	int err;

	spin_lock(&gk_lock);
	portid = gk_listener;
	spin_unlock(&gk_lock);
	if (!portid)
		return -ENOTCONN;

	skb = nlmsg_new(sizeof(val), GFP_KERNEL);
	if (!skb)
		return -ENOMEM;
	nlh = nlmsg_put(skb, 0, 0, GK_MSG_NOTICE, sizeof(val), 0);
	if (!nlh) {
		kfree_skb(skb);
		return -EMSGSIZE;
	}
	memcpy(nlmsg_data(nlh), &val, sizeof(val));
	err = netlink_unicast(gk_nl, skb, portid, MSG_DONTWAIT);
	if (err == -ECONNREFUSED) {
		/* The listener's socket is gone: forget it. */
		spin_lock(&gk_lock);
		if (gk_listener == portid)
			gk_listener = 0;
		spin_unlock(&gk_lock);
	}
	return err < 0 ? err : 0;
}

/* True once the hold @gen on @inum is over, for whatever reason. */
static bool gk_hold_over(u32 inum, u64 gen)
{
	struct gk_entry *e;
	bool over;

	spin_lock(&gk_lock);
	e = gk_find(inum);
	over = gk_exiting || !e || e->gen != gen || e->state != GK_HOLDING;
	spin_unlock(&gk_lock);
	return over;
}

/* End hold @gen on @inum if it is still on and (unless @force) its deadline passed. */
static void gk_end_hold(u32 inum, u64 gen, bool force)
{
	struct gk_entry *e;
	bool ended = false;

	spin_lock(&gk_lock);
	e = gk_find(inum);
	if (e && e->gen == gen && e->state == GK_HOLDING &&
	    (force || time_after_eq(jiffies, e->deadline))) {
		gk_set_state(e, GK_WATCHED);
		ended = true;
	}
	spin_unlock(&gk_lock);
	if (ended)
		wake_up_all(&gk_wq);
}

/**
 * gk_hold() - hold the caller while its namespace's hold is on
 * @inum: the caller's pid namespace inode
 *
 * The first caller after "detect" starts the hold and sends the notice;
 * later callers wait for the same hold. Fails open: without a listener to
 * tell, nothing is held.
 */
static void gk_hold(u32 inum)
{
	unsigned long deadline;
	bool notify = false;
	struct gk_entry *e;
	long left;
	u64 gen;
	int err;

	spin_lock(&gk_lock);
	e = gk_find(inum);
	if (gk_exiting || !e || !gk_is_armed(e->state)) {
		spin_unlock(&gk_lock);
		return;
	}
	if (e->state == GK_ARMED) {
		gk_set_state(e, GK_HOLDING);
		e->gen = ++gk_next_gen;
		e->deadline = jiffies + msecs_to_jiffies(max_block_ms);
		notify = true;
	}
	gen = e->gen;
	deadline = e->deadline;
	spin_unlock(&gk_lock);

	if (notify) {
		err = gk_send_notice(inum);
		if (err) {
			pr_warn_ratelimited("pidns %u: notice not delivered (%d), not holding\n",
					    inum, err);
			gk_end_hold(inum, gen, true);
			return;
		}
		pr_debug("pidns %u: notice sent, holding up to %u ms\n", inum, max_block_ms);
	}

	left = (long)(deadline - jiffies);
	if (left > 0)
		wait_event_killable_timeout(gk_wq, gk_hold_over(inum, gen), left);
	gk_end_hold(inum, gen, false);
}

/**
 * gk_divert() - hold a watched GPU ioctl, then run the original
 * @hook: the entry point it came through
 * @regs: the system call's user registers, as the entry point gets them
 *
 * Returns: whatever the original system call returns.
 */
static long gk_divert(const struct gk_hook *hook, const struct pt_regs *regs)
{
	long ret;

	atomic_inc(&gk_inflight);
	gk_hold(gk_current_pidns());
	ret = hook->orig(regs);
	if (atomic_dec_and_test(&gk_inflight))
		wake_up_all(&gk_wq);
	return ret;
}

static asmlinkage long gk_sys_ioctl(const struct pt_regs *regs)
{
	return gk_divert(&gk_hooks[0], regs);
}

static asmlinkage long gk_compat_sys_ioctl(const struct pt_regs *regs)
{
	return gk_divert(&gk_hooks[1], regs);
}

/* Should the hook divert this call? Runs with preemption off: no sleeping. */
static bool gk_wants(unsigned int cmd)
{
	struct gk_entry *e;
	bool wants;
	u32 inum;

	if (_IOC_TYPE(cmd) != GK_IOC_TYPE || !READ_ONCE(gk_nr_armed))
		return false;
	inum = gk_current_pidns();
	if (!inum)
		return false;
	spin_lock(&gk_lock);
	e = gk_find(inum);
	wants = !gk_exiting && e && gk_is_armed(e->state);
	spin_unlock(&gk_lock);
	return wants;
}

static void notrace gk_ftrace_cb(unsigned long ip, unsigned long parent_ip,
				 struct ftrace_ops *ops, struct ftrace_regs *fregs)
{
	struct pt_regs *regs = ftrace_get_regs(fregs);
	const struct pt_regs *uregs;
	const struct gk_hook *hook;
	unsigned int cmd;
	int i;

	/* Our own call of the original comes back through here: let it pass. */
	if (!regs || within_module(parent_ip, THIS_MODULE))
		return;
	for (i = 0; i < ARRAY_SIZE(gk_hooks); i++) {
		hook = &gk_hooks[i];
		if (!hook->fentry || ip != hook->fentry)
			continue;
		/* Both entry points take the caller's registers as their one argument. */
		uregs = (const struct pt_regs *)regs->di;
		cmd = hook->compat ? (unsigned int)uregs->cx : (unsigned int)uregs->si;
		if (gk_wants(cmd))
			regs->ip = (unsigned long)hook->wrapper;
		return;
	}
	pr_warn_once("called for %pS, which is not hooked: not diverting\n", (void *)ip);
}

static struct ftrace_ops gk_ops = {
	.func = gk_ftrace_cb,
	.flags = FTRACE_OPS_FL_SAVE_REGS | FTRACE_OPS_FL_RECURSION | FTRACE_OPS_FL_IPMODIFY,
};

/**
 * gk_find_original() - find where a hooked entry point starts
 * @hook: the entry point; fills in @hook->fentry and @hook->orig
 *
 * A kprobe is registered only to learn the address and removed at once. On
 * IBT kernels the probe sits after the ENDBR64 that opens the function; an
 * indirect call must land on that ENDBR, so the original is called there.
 * Nothing is ever called through a looked-up symbol pointer.
 *
 * Returns: 0 or a negative errno.
 */
static int gk_find_original(struct gk_hook *hook)
{
	struct kprobe kp = { .symbol_name = hook->name };
	unsigned long addr;
	u32 insn = 0;
	int err;

	err = register_kprobe(&kp);
	if (err)
		return err;
	addr = (unsigned long)kp.addr;
	unregister_kprobe(&kp);

	hook->fentry = addr;
	if (IS_ENABLED(CONFIG_X86_KERNEL_IBT) &&
	    !copy_from_kernel_nofault(&insn, (void *)(addr - sizeof(insn)), sizeof(insn)) &&
	    insn == GK_ENDBR64)
		addr -= sizeof(insn);
	hook->orig = (void *)addr;
	pr_info("hooking %s: ftrace site %pS, original called at %pS\n", hook->name,
		(void *)hook->fentry, (void *)addr);
	return 0;
}

/**
 * gk_prepare_hooks() - find every entry point and add it to the ftrace filter
 *
 * The filter is complete before the ops are registered (ftrace-uses.rst). An
 * optional entry point that cannot be found (no IA32 emulation) is skipped.
 *
 * Returns: 0 or a negative errno.
 */
static int gk_prepare_hooks(void)
{
	struct gk_hook *hook;
	char symbol[64];
	int i, err;

	for (i = 0; i < ARRAY_SIZE(gk_hooks); i++) {
		hook = &gk_hooks[i];
		err = gk_find_original(hook);
		if (!err) {
			strscpy(symbol, hook->name, sizeof(symbol));
			err = ftrace_set_filter(&gk_ops, symbol, strlen(symbol), 0);
		}
		if (!err)
			continue;
		hook->fentry = 0;
		if (hook->required) {
			pr_err("cannot hook %s: %d\n", hook->name, err);
			return err;
		}
		pr_info("%s not hooked (%d): 32-bit callers are not watched\n", hook->name, err);
	}
	return 0;
}

/* Parse a decimal without sign or leading zeros, at most @max. */
static int gk_parse_uint(const char **pos, const char *end, u64 max, u64 *out)
{
	const char *p = *pos;
	u64 val = 0;

	if (p >= end || !isdigit(*p))
		return -EINVAL;
	if (*p == '0' && p + 1 < end && isdigit(p[1]))
		return -EINVAL;
	while (p < end && isdigit(*p)) {
		val = val * 10 + (*p - '0');
		if (val > max)
			return -ERANGE;
		p++;
	}
	*pos = p;
	*out = val;
	return 0;
}

/**
 * gk_parse() - parse one command
 * @buf: the netlink payload, not NUL-terminated
 * @len: its length
 * @cmd: where the result goes
 *
 * The grammar is "Register", "Flush" or "<verb>(<N>):<id>[ <id>]..." with
 * exactly N ids, see docs/gpukmod.md. One trailing NUL is tolerated.
 *
 * Returns: 0; -EMSGSIZE if too long; -E2BIG if N is over GK_MAX_IDS;
 * -ERANGE if a number overflows; -EINVAL for anything else malformed.
 */
static int gk_parse(const char *buf, size_t len, struct gk_cmd *cmd)
{
	const char *end, *p = NULL;
	unsigned int i, j;
	size_t vlen;
	u64 val;
	int v, err;

	if (len > GK_MAX_CMD_LEN)
		return -EMSGSIZE;
	if (len && buf[len - 1] == '\0')
		len--;
	if (!len || memchr(buf, '\0', len))
		return -EINVAL;
	end = buf + len;

	for (v = GK_REGISTER; v < GK_ADD; v++) {
		if (len == strlen(gk_verb_names[v]) && !memcmp(buf, gk_verb_names[v], len)) {
			cmd->verb = v;
			cmd->n = 0;
			return 0;
		}
	}
	for (v = GK_ADD; v < GK_NR_VERBS; v++) {
		vlen = strlen(gk_verb_names[v]);
		if (len > vlen && !memcmp(buf, gk_verb_names[v], vlen) && buf[vlen] == '(') {
			p = buf + vlen + 1;
			break;
		}
	}
	if (!p)
		return -EINVAL;
	cmd->verb = v;

	err = gk_parse_uint(&p, end, U32_MAX, &val);
	if (err)
		return err;
	if (!val)
		return -EINVAL;
	if (val > GK_MAX_IDS)
		return -E2BIG;
	cmd->n = val;
	if (end - p < 2 || p[0] != ')' || p[1] != ':')
		return -EINVAL;
	p += 2;

	for (i = 0; i < cmd->n; i++) {
		if (i) {
			if (p >= end || *p != ' ')
				return -EINVAL;
			p++;
		}
		err = gk_parse_uint(&p, end, U32_MAX, &val);
		if (err)
			return err;
		if (!val)
			return -EINVAL;
		for (j = 0; j < i; j++)
			if (cmd->ids[j] == val)
				return -EINVAL;
		cmd->ids[i] = val;
	}
	return p == end ? 0 : -EINVAL;
}

/* Caller holds gk_lock. Adds every id or none. */
static int gk_apply_add(const struct gk_cmd *cmd)
{
	unsigned int i, fresh = 0, free_slots = 0;
	int s;

	for (s = 0; s < GK_TABLE_SIZE; s++)
		free_slots += gk_table[s].state == GK_FREE;
	for (i = 0; i < cmd->n; i++)
		fresh += !gk_find(cmd->ids[i]);
	if (fresh > free_slots)
		return -ENOSPC;
	for (i = 0; i < cmd->n; i++) {
		if (gk_find(cmd->ids[i]))
			continue;
		for (s = 0; gk_table[s].state != GK_FREE; s++)
			;
		gk_table[s].inum = cmd->ids[i];
		gk_table[s].gen = 0;
		gk_table[s].state = GK_WATCHED;
	}
	return 0;
}

/*
 * Caller holds gk_lock. Every id must be in the table (else -ENOENT and
 * nothing changes). Returns 1 if a hold ended, so waiters must be woken.
 */
static int gk_apply_existing(const struct gk_cmd *cmd)
{
	struct gk_entry *e;
	int woke = 0;
	unsigned int i;

	for (i = 0; i < cmd->n; i++)
		if (!gk_find(cmd->ids[i]))
			return -ENOENT;
	for (i = 0; i < cmd->n; i++) {
		e = gk_find(cmd->ids[i]);
		woke |= e->state == GK_HOLDING && cmd->verb != GK_DETECT;
		switch (cmd->verb) {
		case GK_DELETE:
			gk_set_state(e, GK_WATCHED);
			e->state = GK_FREE;
			break;
		case GK_DETECT:
			if (e->state == GK_WATCHED)
				gk_set_state(e, GK_ARMED);
			break;
		case GK_UNDETECT:
			gk_set_state(e, GK_WATCHED);
			break;
		case GK_RELEASE:
			if (e->state == GK_HOLDING)
				gk_set_state(e, GK_WATCHED);
			break;
		default:
			break;
		}
	}
	return woke;
}

/*
 * Caller holds gk_lock. Empties the table: what a starting agent does, since
 * the entries a crashed one left (some armed) belong to no plan any more.
 * Sets *@removed to how many there were; returns 1 if a hold ended.
 */
static int gk_apply_flush(unsigned int *removed)
{
	int i, woke = 0;

	*removed = 0;
	for (i = 0; i < GK_TABLE_SIZE; i++) {
		if (gk_table[i].state == GK_FREE)
			continue;
		woke |= gk_table[i].state == GK_HOLDING;
		gk_set_state(&gk_table[i], GK_WATCHED);
		gk_table[i].state = GK_FREE;
		(*removed)++;
	}
	return woke;
}

static int gk_apply(const struct gk_cmd *cmd, u32 portid)
{
	unsigned int flushed = 0;
	int ret;

	spin_lock(&gk_lock);
	switch (cmd->verb) {
	case GK_REGISTER:
		gk_listener = portid;
		ret = 0;
		break;
	case GK_FLUSH:
		ret = gk_apply_flush(&flushed);
		break;
	case GK_ADD:
		ret = gk_apply_add(cmd);
		break;
	default:
		ret = gk_apply_existing(cmd);
		break;
	}
	spin_unlock(&gk_lock);

	if (ret > 0) {
		wake_up_all(&gk_wq);
		ret = 0;
	}
	if (cmd->verb == GK_FLUSH)
		pr_info_ratelimited("portid %u flushed the table: %u entries removed\n",
				    portid, flushed);
	if (!ret)
		pr_debug("%s(%u) from portid %u done\n", gk_verb_names[cmd->verb], cmd->n, portid);
	return ret;
}

static int gk_nl_msg(struct sk_buff *skb, struct nlmsghdr *nlh,
		     struct netlink_ext_ack *extack)
{
	struct gk_cmd cmd;
	int err;

	if (!netlink_capable(skb, CAP_NET_ADMIN)) {
		pr_warn_ratelimited("portid %u: command refused, CAP_NET_ADMIN needed\n",
				    NETLINK_CB(skb).portid);
		return -EPERM;
	}
	if (nlh->nlmsg_type != GK_MSG_CMD) {
		pr_warn_ratelimited("portid %u: unknown message type %u rejected\n",
				    NETLINK_CB(skb).portid, nlh->nlmsg_type);
		NL_SET_ERR_MSG(extack, "gpukmod: unknown message type");
		return -EOPNOTSUPP;
	}
	err = gk_parse(nlmsg_data(nlh), nlmsg_len(nlh), &cmd);
	if (err) {
		pr_warn_ratelimited("portid %u: malformed command rejected (%d, %d bytes)\n",
				    NETLINK_CB(skb).portid, err, nlmsg_len(nlh));
		NL_SET_ERR_MSG(extack, "gpukmod: malformed command");
		return err;
	}
	return gk_apply(&cmd, NETLINK_CB(skb).portid);
}

static void gk_nl_input(struct sk_buff *skb)
{
	netlink_rcv_skb(skb, gk_nl_msg);
}

/**
 * gk_nl_notify() - forget a listener whose socket closed and end its holds
 * @nb: our notifier block
 * @event: the netlink event; only NETLINK_URELEASE matters
 * @ptr: the struct netlink_notify of the closing socket
 *
 * Returns: NOTIFY_DONE.
 */
static int gk_nl_notify(struct notifier_block *nb, unsigned long event, void *ptr)
{
	const struct netlink_notify *n = ptr;
	bool ended = false;
	int i;

	if (event != NETLINK_URELEASE || n->protocol != nl_unit || !net_eq(n->net, &init_net))
		return NOTIFY_DONE;
	spin_lock(&gk_lock);
	if (gk_listener && n->portid == gk_listener) {
		gk_listener = 0;
		for (i = 0; release_on_close && i < GK_TABLE_SIZE; i++) {
			if (gk_table[i].state != GK_HOLDING)
				continue;
			gk_set_state(&gk_table[i], GK_WATCHED);
			ended = true;
		}
	}
	spin_unlock(&gk_lock);
	if (ended) {
		pr_info_ratelimited("listener portid %u closed: held ioctls released\n", n->portid);
		wake_up_all(&gk_wq);
	}
	return NOTIFY_DONE;
}

static struct notifier_block gk_nl_nb = {
	.notifier_call = gk_nl_notify,
};

/**
 * gk_release_all() - stop holding anyone and wait until nobody is in our code
 *
 * Called after the ftrace ops are gone, so no new caller can arrive. A task
 * diverted just before that may sit between the trampoline and the inflight
 * count, and one that decremented it may not have returned yet: RCU Tasks
 * waits for both, since neither has passed a voluntary context switch.
 */
static void gk_release_all(void)
{
	spin_lock(&gk_lock);
	gk_exiting = true;
	spin_unlock(&gk_lock);
	wake_up_all(&gk_wq);

	synchronize_rcu_tasks();
	wait_event(gk_wq, !atomic_read(&gk_inflight));
	synchronize_rcu_tasks();
}

static int __init gk_init(void)
{
	struct netlink_kernel_cfg cfg = { .input = gk_nl_input };
	int err;

	if (nl_unit < 0 || nl_unit >= MAX_LINKS) {
		pr_err("nl_unit=%d is out of range 0..%d\n", nl_unit, MAX_LINKS - 1);
		return -EINVAL;
	}
	if (!max_block_ms || max_block_ms > GK_MAX_BLOCK_MS_LIMIT) {
		pr_err("max_block_ms=%u is out of range 1..%u\n", max_block_ms,
		       GK_MAX_BLOCK_MS_LIMIT);
		return -EINVAL;
	}
	if (!IS_ENABLED(CONFIG_TASKS_RCU)) {
		pr_err("CONFIG_TASKS_RCU is off: unload could not be made safe, refusing to load\n");
		return -EOPNOTSUPP;
	}

	gk_nl = netlink_kernel_create(&init_net, nl_unit, &cfg);
	if (!gk_nl) {
		pr_err("netlink_kernel_create(unit %d) failed: is the unit taken? try nl_unit=\n",
		       nl_unit);
		return -EBUSY;
	}

	err = netlink_register_notifier(&gk_nl_nb);
	if (err) {
		pr_err("netlink_register_notifier failed: %d\n", err);
		goto err_release_netlink;
	}
	err = gk_prepare_hooks();
	if (err)
		goto err_clear_filter;
	err = register_ftrace_function(&gk_ops);
	if (err) {
		/* Only one IPMODIFY user may hold a function: say who to suspect. */
		if (err == -EBUSY)
			pr_err("register_ftrace_function failed: %d: another IPMODIFY user (a livepatch or hook module) holds an ioctl entry point\n",
			       err);
		else
			pr_err("register_ftrace_function failed: %d\n", err);
		goto err_clear_filter;
	}

	pr_info("version %s loaded: netlink unit %d, max_block_ms %u\n",
		GPUKMOD_VERSION, nl_unit, max_block_ms);
	return 0;

err_clear_filter:
	ftrace_free_filter(&gk_ops);
	netlink_unregister_notifier(&gk_nl_nb);
err_release_netlink:
	netlink_kernel_release(gk_nl);
	return err;
}

static void __exit gk_exit(void)
{
	int err;

	err = unregister_ftrace_function(&gk_ops);
	if (err)
		pr_err("unregister_ftrace_function failed: %d\n", err);
	ftrace_free_filter(&gk_ops);
	gk_release_all();
	netlink_unregister_notifier(&gk_nl_nb);
	netlink_kernel_release(gk_nl);
	pr_info("version %s unloaded\n", GPUKMOD_VERSION);
}

module_init(gk_init);
module_exit(gk_exit);

MODULE_LICENSE("GPL");
MODULE_AUTHOR("gpushare");
MODULE_DESCRIPTION("Hold a watched container's GPU ioctls and tell user space it is back");
MODULE_VERSION(GPUKMOD_VERSION);
