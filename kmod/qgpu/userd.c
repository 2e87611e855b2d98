// SPDX-License-Identifier: GPL-2.0
/*
 * qgpu: reading channels' USERD, to tell whether a channel has work.
 *
 * What "busy" means on the hardware. A process submits work with no system call: it writes
 * GPFIFO entries, moves GP_PUT in the channel's USERD and rings the doorbell. The GPU's GPFIFO
 * fetcher moves GP_GET past an entry when it fetches it, not when the work is done. So
 * GP_PUT != GP_GET says "submitted work not yet fetched", and nothing in USERD says "a fetched
 * kernel is still running": right after a long kernel is fetched its channel reads idle. A loop
 * that waits for each result shows GP_PUT != GP_GET only for the few us between a launch and
 * its fetch (measured on an H100 from inside PyTorch: 0.3 % of the time with 1.6 ms matmuls,
 * 4.5 % with 44 us ones; a loop that launches ahead, 99.9 %: tools/gpu/userd_fetch.py), but its
 * GP_GET moves at every launch. qgpu counts a cgroup as busy while one of its channels shows
 * GP_PUT != GP_GET or a GP_GET that moved since the previous look, and, after the last look that
 * saw one so, for busy_hold_us more of the time qgpu leaves the cgroup open (a closed
 * cgroup's hold does not run down: work taken off the GPU by FIFO_DISABLE_CHANNELS is still
 * owed its time). A kernel that runs longer than that after its fetch reads idle before it
 * ends; busy_hold_us is the knob.
 * A signal of a fetched kernel still running exists, but not in USERD: GR_GET_CTXSW_STATS on
 * the TSG counts the saves of its context, and one taken off the engine mid-work is saved by
 * CILP (or CTA), one with nothing to run by wait-for-idle. Read from userspace on tenants'
 * TSGs (the rm enforcer does, enforcers/rm/sensor.py), a loop idle to every call it made was
 * saved 10-13 times in 5 ms beside a trainer, on an H100 and an H200 (BENCHMARKS.md,
 * 2026-11-28, eighteenth session), and each close of it mid-kernel was one CILP save, while a
 * context with nothing to run was never saved. A TSG alone on the engine is switched by nothing,
 * so qgpu reads it around its own closes: an owed cgroup whose close took a kernel off is owed
 * in full again (sched.c: probe_close()).
 * What that costs: an online cgroup in such a kernel lets offline work in beside it (they share
 * the GPU by the hardware's timeslices), and an offline holder in one passes the GPU on and is
 * closed with its kernel preempted; the kernel runs again when its cgroup is next opened, which
 * for a cgroup that submits nothing more is only when the scheduler opens idle cgroups.
 *
 * Where USERD is. libcuda gives each channel a 512-byte USERD slot in a video memory object of
 * its own (hUserdMemory[0], userdOffset[0] in the channel's allocation parameters; 0x2000 +
 * 0x3000 * n in a 2 MiB object in the H200 trace), maps that object through BAR1 (I/O memory, no
 * struct page) and never maps the channel itself: RM refuses to map a channel whose USERD the
 * client supplied (kchannelMap_IMPL, kernel_channel.c). RM_MAP_MEMORY says which (client,
 * object, offset) a file's mmap maps; when the mmap happens, qgpu looks up the physical page
 * behind every page of it (follow_pte works on VM_PFNMAP mappings) and keeps that record. A
 * channel whose USERD lies in a recorded mapping is read through an ioremap of its page (BAR1),
 * or through a reference on the page when it is RAM (USERD that RM allocated, mapped by mapping
 * the channel: the channel is its own USERD object, at offset 0).
 *
 * Never a stale mapping. The bus address is RM's BAR1 mapping of the object, which lives until
 * RM_UNMAP_MEMORY or until the object (or an ancestor, or its client) is freed; the user's page
 * tables do not matter. qgpu drops the record and every reader made from it under qgpu_lock
 * before it lets such a call reach the driver, and the scheduler reads only under qgpu_lock.
 *
 * A channel qgpu cannot read (its USERD never mapped, or the mapping gone): an offline channel
 * counts as busy, which its share bounds; an online one counts as busy for blind_busy_ms after
 * qgpu lost sight of it (or after it was made) and then as idle, so that online work qgpu cannot
 * see never keeps offline work closed for long.
 *
 * Cold channels. Each read of USERD in BAR1 is an uncached load across PCIe: 1.0-1.2 us each
 * from a CUDA process on an H100 and an H200 (tools/gpu/userd_fetch.py: its watcher's loads of
 * its own 20 channels' USERD, reads over the run's span; BENCHMARKS.md, thirty-eighth session).
 * CUDA makes 20 channels a context and feeds one or two, and a pass reads every channel of an
 * idle cgroup, under qgpu_lock: at 250 us a pass, every idle CUDA process would cost a core
 * about 8 % and hold qgpu_lock about 22 us of every pass. So a channel that has shown no work
 * for COLD_AFTER_MS is read once every cold_look_us (spread over the passes by its handle), not
 * at every pass; any work seen makes it warm again. What that costs: work first put on a cold
 * channel is seen up to cold_look_us late (2 ms by default: within busy_hold_us and
 * start_grace_us, and 4 % of the default period); a request stream's channel stays warm while
 * its requests come more often than once a second. 0 reads every channel at every pass.
 *
 * Dormant channels. Cold looks still cost every idle channel 500 reads a second: ten idle CUDA
 * processes, 200 channels, about 100 000 reads a second, 11 % of a core and 37 us of qgpu_lock
 * in every pass. Most of those channels are fed only while CUDA sets the context up: in ten
 * PyTorch processes (eight on H100s, two on H200s), 19 of the 20 channels showed no work after
 * the first request began, their last 76-129 ms after the watcher first read them, and channel
 * 0 carried every kernel (tools/gpu/channel_use.py over userd_fetch.py's raw results). So a cold
 * channel that has shown no work COLD_AFTER_MS or more after it became readable is dormant, and
 * read once every dormant_look_us (32 ms by default, never more often than cold_look_us; 0 means
 * as cold_look_us). Work seen on it later makes it warm, and it is never dormant again. What
 * that costs: the first work a process puts on such a channel (a stream first used late, or a
 * server's first request after a start-up shorter than a second) is seen up to dormant_look_us
 * late, once in the channel's life.
 *
 * Everything here runs under qgpu_lock.
 */
#include <linux/build_bug.h>
#include <linux/hash.h>
#include <linux/io.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/ktime.h>
#include <linux/lockdep.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/slab.h>

#include "qgpu.h"

static unsigned int busy_hold_us = 2000;
module_param(busy_hold_us, uint, 0644);
MODULE_PARM_DESC(busy_hold_us,
		 "A channel counts as busy this much open time after GP_PUT != GP_GET was last seen, us");

static unsigned int blind_busy_ms = 1000;
module_param(blind_busy_ms, uint, 0644);
MODULE_PARM_DESC(blind_busy_ms,
		 "An online channel whose USERD qgpu cannot read counts as busy this long, ms");

static unsigned int cold_look_us = 2000;

/* A bad value, out of range or not a number, is -EINVAL (kstrtouint says -ERANGE too). */
static int look_every_set(const char *val, const struct kernel_param *kp)
{
	int err = param_set_uint_minmax(val, kp, 0, USEC_PER_SEC);

	return err ? -EINVAL : 0;
}

static const struct kernel_param_ops look_every_ops = {
	.set = look_every_set,
	.get = param_get_uint,
};

module_param_cb(cold_look_us, &look_every_ops, &cold_look_us, 0644);
MODULE_PARM_DESC(cold_look_us,
		 "A channel with no work seen for a second is read this often, us (0: every pass; at most 1 s)");

static unsigned int dormant_look_us = 32000;
module_param_cb(dormant_look_us, &look_every_ops, &dormant_look_us, 0644);
MODULE_PARM_DESC(dormant_look_us,
		 "A cold channel whose only work came in its first second is read this often, us (0: as cold_look_us; at most 1 s)");

/* How long a channel shows no work before it is read only every cold_look_us (see the top). */
#define COLD_AFTER_MS	1000

/* Mappings bigger than this are not recorded (USERD objects are 2 MiB in the H200 trace). */
#define MAP_MAX_PAGES	2048

/* How qgpu reads one channel's USERD: a referenced RAM page or an ioremap of a BAR page. */
struct qgpu_userd {
	struct page *page;
	void __iomem *io;	/* the page's start */
	unsigned int in_page;	/* the slot's offset in it */
	u32 object;		/* the memory object it was found in */
};

/* A recorded mmap of (client, object): the physical page behind each of its pages. */
struct userd_map {
	struct list_head node;
	u32 client;
	u32 object;
	u64 offset;		/* of the object, where the mapping starts; page-aligned */
	u64 linear;		/* RM_MAP_MEMORY's answer, which RM_UNMAP_MEMORY names */
	u32 npages;
	unsigned long pfn[];	/* 0: none there when it was mapped */
};

static LIST_HEAD(maps);

/**
 * qgpu_channel_class() - whether a class is a GPFIFO channel
 * @hclass: an RM class
 *
 * Return: true for every GPFIFO channel class from Volta (C36F) on: they all end in 6F.
 */
bool qgpu_channel_class(u32 hclass)
{
	return (hclass & 0xff) == 0x6f && hclass >= 0xc36f && hclass <= 0xcf6f;
}

static void reader_free(struct qgpu_userd *r)
{
	if (r->page)
		put_page(r->page);
	if (r->io)
		iounmap(r->io);
	kfree(r);
}

/* The channel can no longer be read: from now on it is blind (see the top). */
static void channel_blind(struct qgpu_obj *ch)
{
	if (ch->userd) {
		reader_free(ch->userd);
		ch->userd = NULL;
	}
	ch->userd_blind = ktime_get_ns();
}

/* A reader for the channel's slot, if @m covers it. */
static struct qgpu_userd *reader_from(const struct userd_map *m, const struct qgpu_obj *ch)
{
	u64 rel, len = (u64)m->npages << PAGE_SHIFT;
	struct qgpu_userd *r;
	unsigned long pfn;

	if (ch->userd_offset < m->offset || ch->userd_offset - m->offset > len - NVRM_USERD_SIZE)
		return NULL;
	rel = ch->userd_offset - m->offset;
	/* A 512-byte-aligned slot never crosses a page; a misaligned one is not read. */
	if (offset_in_page(rel) > PAGE_SIZE - NVRM_USERD_SIZE)
		return NULL;
	pfn = m->pfn[rel >> PAGE_SHIFT];
	if (!pfn)
		return NULL;
	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return NULL;
	r->in_page = offset_in_page(rel);
	r->object = m->object;
	if (pfn_valid(pfn)) {
		r->page = pfn_to_page(pfn);
		if (!get_page_unless_zero(r->page)) {
			kfree(r);
			return NULL;
		}
	} else {
		/* I/O memory (BAR1): uncached, whatever type the driver's own mapping has. */
		r->io = ioremap(PFN_PHYS(pfn), PAGE_SIZE);
		if (!r->io) {
			kfree(r);
			return NULL;
		}
	}
	return r;
}

/* Find a reader for a blind channel among the client's recorded mappings. */
static void channel_find(u32 hclient, struct qgpu_obj *ch)
{
	struct userd_map *m;

	if (ch->userd)
		return;
	list_for_each_entry(m, &maps, node) {
		if (m->client != hclient || m->object != ch->userd_mem)
			continue;
		ch->userd = reader_from(m, ch);
		if (ch->userd) {
			/* Newly readable: warm, read at every pass for COLD_AFTER_MS at least. */
			ch->userd_seen = ktime_get_ns();
			ch->userd_born = ch->userd_seen;
			ch->userd_next = 0;
			return;
		}
	}
}

/* Look again for every blind channel of @hclient whose USERD is in @object. */
static void client_refind(u32 hclient, u32 object)
{
	struct qgpu_client *client = qgpu_client_find(hclient);
	struct qgpu_obj *obj;

	if (!client)
		return;
	list_for_each_entry(obj, &client->objects, node)
		if (obj->kind == QGPU_OBJ_CHANNEL && obj->userd_mem == object)
			channel_find(hclient, obj);
}

/**
 * qgpu_userd_channel_alloc() - note where a new channel's USERD is
 * @hclient: its client
 * @ch: the channel as tracked
 * @huserd: hUserdMemory[0] of its allocation parameters, from qgpu's copy (0: RM's USERD)
 * @offset: userdOffset[0], from the same copy
 *
 * Context: qgpu_lock held.
 */
void qgpu_userd_channel_alloc(u32 hclient, struct qgpu_obj *ch, u32 huserd, u64 offset)
{
	lockdep_assert_held(&qgpu_lock);
	/* RM's own USERD is reached by mapping the channel: the channel is its object. */
	ch->userd_mem = huserd ? huserd : ch->handle;
	ch->userd_offset = huserd ? offset : 0;
	ch->userd_blind = ktime_get_ns();
	channel_find(hclient, ch);
}

/**
 * qgpu_userd_mmap() - record what a successful mmap of an RM mapping maps
 * @file: the file mapped, whose RM_MAP_MEMORY context says what it maps
 * @vma: the new mapping, its page tables filled by the driver
 *
 * Context: qgpu_lock and the mm's mmap_lock held.
 */
void qgpu_userd_mmap(struct file *file, struct vm_area_struct *vma)
{
	const struct qgpu_mapping *ctx = qgpu_mapping_of(file);
	unsigned long npages = vma_pages(vma), i;
	struct userd_map *m;

	lockdep_assert_held(&qgpu_lock);
	if (!ctx || !npages || npages > MAP_MAX_PAGES || !PAGE_ALIGNED(ctx->offset) ||
	    !qgpu_client_find(ctx->client))
		return;
	m = kzalloc(struct_size(m, pfn, npages), GFP_KERNEL);
	if (!m)
		return;
	m->client = ctx->client;
	m->object = ctx->object;
	m->offset = ctx->offset;
	m->linear = ctx->linear;
	m->npages = npages;
	for (i = 0; i < npages; i++) {
		spinlock_t *ptl;	/* the page table lock follow_pte takes */
		pte_t *ptep;

		if (follow_pte(vma->vm_mm, vma->vm_start + (i << PAGE_SHIFT), &ptep, &ptl))
			continue;
		if (pte_present(*ptep))
			m->pfn[i] = pte_pfn(*ptep);
		pte_unmap_unlock(ptep, ptl);
	}
	list_add_tail(&m->node, &maps);
	client_refind(m->client, m->object);
}

/* Drop @m and every reader made from it; the channels look again among what is left. */
static void map_drop(struct userd_map *m)
{
	struct qgpu_client *client = qgpu_client_find(m->client);
	struct qgpu_obj *obj;

	list_del(&m->node);
	if (client)
		list_for_each_entry(obj, &client->objects, node)
			if (obj->kind == QGPU_OBJ_CHANNEL && obj->userd &&
			    obj->userd->object == m->object)
				channel_blind(obj);
	if (client)
		client_refind(m->client, m->object);
	kfree(m);
}

/* Whether @handle is @ancestor or below it in the client's tree, as qgpu tracks it. */
static bool below(struct qgpu_client *client, u32 handle, u32 ancestor)
{
	int depth;

	for (depth = 0; depth < 16 && handle; depth++) {
		struct qgpu_obj *obj;

		if (handle == ancestor)
			return true;
		obj = client ? qgpu_obj_find(client, handle) : NULL;
		if (!obj || obj->parent == handle)
			return false;
		handle = obj->parent;
	}
	return false;
}

/**
 * qgpu_userd_forget() - before RM frees an object: drop the mappings of it and below it
 * @hclient: the client
 * @hobject: the object RM_FREE names; the client's own handle or 0: all of the client's
 *
 * RM tears down its BAR1 mappings of what it frees; nothing of them may be read after.
 * Context: qgpu_lock held.
 */
void qgpu_userd_forget(u32 hclient, u32 hobject)
{
	struct qgpu_client *client = qgpu_client_find(hclient);
	struct userd_map *m, *tmp;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry_safe(m, tmp, &maps, node) {
		if (m->client != hclient)
			continue;
		if (hobject && hobject != hclient && !below(client, m->object, hobject))
			continue;
		map_drop(m);
	}
}

/**
 * qgpu_userd_unmap() - before RM_UNMAP_MEMORY: drop the mapping it names
 * @hclient: the client
 * @hmemory: the object
 * @linear: the address RM_MAP_MEMORY answered for the mapping
 *
 * Context: qgpu_lock held.
 */
void qgpu_userd_unmap(u32 hclient, u32 hmemory, u64 linear)
{
	struct userd_map *m, *tmp;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry_safe(m, tmp, &maps, node)
		if (m->client == hclient && m->object == hmemory && m->linear == linear)
			map_drop(m);
}

/**
 * qgpu_userd_file_released() - before the driver frees the clients that live on a file
 * @file: the file being released
 *
 * Context: qgpu_lock held.
 */
void qgpu_userd_file_released(struct file *file)
{
	struct qgpu_client *client;

	lockdep_assert_held(&qgpu_lock);
	list_for_each_entry(client, &qgpu_clients, node)
		if (client->file == file)
			qgpu_userd_forget(client->handle, 0);
}

/**
 * qgpu_userd_obj_drop() - a tracked object is gone: what qgpu read through it goes too
 * @hclient: its client
 * @obj: the object
 *
 * Context: qgpu_lock held.
 */
void qgpu_userd_obj_drop(u32 hclient, struct qgpu_obj *obj)
{
	struct userd_map *m, *tmp;

	lockdep_assert_held(&qgpu_lock);
	if (obj->userd) {
		reader_free(obj->userd);
		obj->userd = NULL;
	}
	list_for_each_entry_safe(m, tmp, &maps, node)
		if (m->client == hclient && m->object == obj->handle)
			map_drop(m);
}

/**
 * qgpu_userd_exit() - free the USERD mappings qgpu still notes, at unload
 *
 * Every object has been dropped already, so nothing reads them any more.
 *
 * Context: module exit, after the hooks and the schedulers have stopped.
 */
void qgpu_userd_exit(void)
{
	struct userd_map *m, *tmp;

	list_for_each_entry_safe(m, tmp, &maps, node) {
		list_del(&m->node);
		kfree(m);
	}
}

/*
 * GP_GET and GP_PUT sit side by side in one aligned 8-byte word: one 64-bit read takes both, a
 * single PCIe read where USERD is in BAR1 (each uncached read costs the CPU a round trip to the
 * GPU, about 1.1 us on an H100 and an H200, and a pass reads every warm gated channel).
 */
static_assert(NVRM_USERD_GP_GET + 4 == NVRM_USERD_GP_PUT);
static_assert(IS_ALIGNED(NVRM_USERD_GP_GET, 8));

/* The channel's GP_GET and GP_PUT, in one read. */
static void read_gets(const struct qgpu_userd *r, u32 *get, u32 *put)
{
	u64 both;

	if (r->io)
		both = readq(r->io + r->in_page + NVRM_USERD_GP_GET);
	else
		both = READ_ONCE(*(const u64 *)(page_address(r->page) + r->in_page +
						NVRM_USERD_GP_GET));
	*get = lower_32_bits(both);
	*put = upper_32_bits(both);
}

/*
 * Whether to read the channel at this pass: always while it is warm; once cold, when its next
 * look is due, each cold_look_us after the one before, or each dormant_look_us if it is
 * dormant (never the shorter of the two). A channel's first cold look falls at a point of that
 * interval set by its handle, so that a process's cold channels, which went cold together, are
 * read over many passes rather than all in one.
 */
static bool look_now(struct qgpu_obj *ch, u64 now)
{
	u64 every = (u64)READ_ONCE(cold_look_us) * NSEC_PER_USEC;

	/* A pass's clock is read before it takes qgpu_lock: a reader found since is newer. */
	if (!every || now < ch->userd_seen ||
	    now - ch->userd_seen < (u64)COLD_AFTER_MS * NSEC_PER_MSEC)
		return true;
	if (!ch->userd_used)
		every = max_t(u64, every, (u64)READ_ONCE(dormant_look_us) * NSEC_PER_USEC);
	if (!ch->userd_next) {
		/* Cold from this pass on. */
		ch->userd_next = now + 1 + (every * hash_32(ch->handle, 16) >> 16);
		return false;
	}
	if (now < ch->userd_next)
		return false;
	/* Due: the next look an interval on, in step unless this pass came an interval late. */
	ch->userd_next = now - ch->userd_next < every ? ch->userd_next + every : now + every;
	return true;
}

/**
 * qgpu_channel_look() - what a channel's USERD shows now (see the top)
 * @cg: the channel's cgroup
 * @ch: the channel
 * @now: ktime_get_ns() of this scheduler pass
 *
 * QGPU_LOOK_MOVED says GP_GET moved since the previous look at this channel: the GPU fetched
 * from it in between, so it has been on the engine. A channel qgpu cannot read shows no
 * movement, and counts as pending as the top says. A cold channel not due at this pass is not
 * read and shows nothing (see the top).
 *
 * Context: qgpu_lock held.
 * Return: QGPU_LOOK_PENDING (GP_PUT != GP_GET, or blind and counted busy), QGPU_LOOK_MOVED,
 * and QGPU_LOOK_READ where USERD was read.
 */
unsigned int qgpu_channel_look(const struct qgpu_cg *cg, struct qgpu_obj *ch, u64 now)
{
	unsigned int look = QGPU_LOOK_READ;
	u32 get, put;

	lockdep_assert_held(&qgpu_lock);
	if (!ch->userd) {
		if (cg->class != QGPU_CLASS_ONLINE ||
		    now - ch->userd_blind < (u64)blind_busy_ms * NSEC_PER_MSEC)
			return QGPU_LOOK_PENDING;
		return 0;
	}
	if (!look_now(ch, now))
		return 0;
	read_gets(ch->userd, &get, &put);
	if (get != put)
		look |= QGPU_LOOK_PENDING;
	if (get != ch->userd_get)
		look |= QGPU_LOOK_MOVED;
	ch->userd_get = get;
	if (look & (QGPU_LOOK_PENDING | QGPU_LOOK_MOVED)) {
		ch->userd_seen = now;
		ch->userd_next = 0;
		if (now >= ch->userd_born &&
		    now - ch->userd_born >= (u64)COLD_AFTER_MS * NSEC_PER_MSEC)
			ch->userd_used = true;
	}
	return look;
}

/**
 * qgpu_cg_busy() - whether a cgroup counts as busy, from what its channels showed this pass
 * @cg: a gated cgroup
 * @pending: one of its channels showed work pending at this pass, or had work fetched since
 *	the previous one (GP_GET moved)
 * @dt: ns since the previous pass
 *
 * A cgroup stays busy for busy_hold_us of open time after a channel of it last showed work
 * pending (see the top). The hold is the cgroup's, not each channel's: the cgroup is busy while
 * any of its channels is, so the scheduler can stop reading a cgroup's channels at the first
 * that shows work. It runs down only while the cgroup was meant to run (cg->open, from the
 * previous pass): a closed cgroup's work is still owed its time.
 *
 * Context: qgpu_lock held; once a scheduler pass per gated cgroup.
 * Return: true if the cgroup counts as busy now.
 */
bool qgpu_cg_busy(struct qgpu_cg *cg, bool pending, u64 dt)
{
	lockdep_assert_held(&qgpu_lock);
	if (pending) {
		cg->hold_ns = (u64)busy_hold_us * NSEC_PER_USEC;
		return true;
	}
	if (cg->open)
		cg->hold_ns -= min(cg->hold_ns, dt);
	return cg->hold_ns > 0;
}
