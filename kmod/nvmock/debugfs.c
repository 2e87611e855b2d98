// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: ground truth in debugfs, under /sys/kernel/debug/nvmock/.
 *
 *   objects		live objects by kind, backing buffers, mappings and UVM ranges (zero when
 *			all is freed)
 *   bar1		the BAR1 aperture video memory lives in: phys, size and bytes free, or
 *			"absent" (no ivshmem device: video memory is system RAM)
 *   kapi		what the in-kernel RM entry served: counts, then its latest ops (allocs
 *			and frees, then controls), one a line: op, class/handle/command,
 *			pRightsRequested, paramsSize and flags as read, the status written back
 *   kapi_fail		write a class number: the next kernel ALLOC of it fails with
 *			NV_ERR_INSUFFICIENT_RESOURCES (a test's fault, not the driver's behaviour)
 *   kapi_fail_control	write a control command and a count ("0xa06c0103 2"): the next
 *			that many kernel CONTROLs of it fail with NV_ERR_INVALID_STATE (a test's
 *			fault); a count of 0 disarms it; "acted" after the count: each is carried
 *			out before the failure is answered
 *   kapi_version	write a version: nvidia_get_rm_ops takes and answers that version as
 *			its own, as another driver would (a test's pose); an empty line: its own
 *   slow_calls		write a thread group id and ms ("1234 500"): its RM_ALLOC, RM_FREE,
 *			VID_HEAP_CONTROL and DUP_OBJECT answer that much later, outside every
 *			lock (a test's delay, not the driver's behaviour); "0 0" disarms it
 *   slow_kapi		the same for the in-kernel RM entry's ops sent from that thread group's
 *			context (a hook's queries of RM run in the tenant's); for both, a
 *			thread's id instead names that thread alone
 *   gpuN/engine	context switches, time spent switching and running, and switches by
 *			how far they ran past switch_us: under 10 us, under 100 us, under 1 ms,
 *			more
 *   gpuN/processes	GPU time per process (kept after the process exits, until reset)
 *   gpuN/tsgs		per TSG: id, process, timeslice, GPU time, channels
 *   gpuN/channels	per channel: chid, TSG, enabled, scheduled, faulted, GP_GET as the GPU
 *			wrote it to USERD (what a reader of USERD sees), GPU time, GP_PUT as its
 *			process wrote it, whether fetched work is left to run,
 *			closes outstanding and the most ever outstanding at once
 *   gpuN/memory	device memory size, use, and the most used at once (fb_peak)
 *   gpuN/reset		write anything: statistics back to zero, fb_peak to the use now
 */
#include <linux/debugfs.h>
#include <linux/seq_file.h>

#include "nvmock.h"

static struct dentry *root;

static int objects_show(struct seq_file *m, void *unused)
{
	int kind;

	for (kind = 0; kind < NVMOCK_KINDS; kind++)
		seq_printf(m, "%s %d\n", nvmock_kind_name(kind), atomic_read(&nvmock_counts[kind]));
	seq_printf(m, "buffers %d\n", atomic_read(&nvmock_buffers));
	seq_printf(m, "mappings %d\n", atomic_read(&nvmock_vmas));
	seq_printf(m, "uvm_ranges %d\n", atomic_read(&nvmock_uvm_ranges));
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(objects);

static int bar1_show(struct seq_file *m, void *unused)
{
	nvmock_bar1_show(m);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(bar1);

static void kapi_ring_show(struct seq_file *m, const struct nvmock_kapi_ring *ring)
{
	u32 i, n = min_t(u32, ring->next, NVMOCK_KAPI_LOG);

	for (i = ring->next - n; i != ring->next; i++) {
		const struct nvmock_kapi_record *r = &ring->r[i % NVMOCK_KAPI_LOG];

		seq_printf(m, "op 0x%x 0x%x rights 0x%llx params_size %u flags 0x%x status 0x%x\n",
			   r->op, r->what, r->rights, r->params_size, r->flags, r->status);
	}
}

static int kapi_show(struct seq_file *m, void *unused)
{
	const struct nvmock_kapi_stats *k = &nvmock_kapi;

	mutex_lock(&nvmock_lock);
	seq_printf(m, "allocs %llu\nfrees %llu\ncontrols %llu\nfailed %llu\nbad_rights %llu\n",
		   k->allocs, k->frees, k->controls, k->failed, k->bad_rights);
	seq_printf(m, "not_modelled %llu\nunknown %llu\n", k->not_modelled, k->unknown);
	seq_printf(m, "absent %llu\n", k->absent);
	kapi_ring_show(m, &k->objects);
	kapi_ring_show(m, &k->controls_log);
	mutex_unlock(&nvmock_lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(kapi);

static int engine_show(struct seq_file *m, void *unused)
{
	struct nvmock_gpu *gpu = m->private;
	struct nvmock_engine *engine = &gpu->engine;

	spin_lock(&engine->lock);
	seq_printf(m, "switches %llu\nswitch_ns %llu\nbusy_ns %llu\n",
		   engine->switches, engine->switch_ns, engine->busy_ns);
	seq_printf(m, "switch_over_10us %llu\nswitch_over_100us %llu\nswitch_over_1ms %llu\n"
		   "switch_over_more %llu\n", engine->switch_over[0], engine->switch_over[1],
		   engine->switch_over[2], engine->switch_over[3]);
	spin_unlock(&engine->lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(engine);

static int processes_show(struct seq_file *m, void *unused)
{
	struct nvmock_gpu *gpu = m->private;
	struct nvmock_engine *engine = &gpu->engine;
	int i;

	spin_lock(&engine->lock);
	for (i = 0; i < NVMOCK_MAX_PROCESSES; i++)
		if (engine->processes[i].tgid)
			seq_printf(m, "%d %llu\n", engine->processes[i].tgid,
				   engine->processes[i].gpu_ns);
	spin_unlock(&engine->lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(processes);

static int tsgs_show(struct seq_file *m, void *unused)
{
	struct nvmock_gpu *gpu = m->private;
	struct nvmock_engine *engine = &gpu->engine;
	struct nvmock_tsg *tsg;

	spin_lock(&engine->lock);
	list_for_each_entry(tsg, &engine->runlist, runlist_node) {
		struct nvmock_channel *ch;
		int channels = 0;

		list_for_each_entry(ch, &tsg->channels, tsg_node)
			channels++;
		seq_printf(m, "%u pid %d timeslice_us %llu interleave %u gpu_ns %llu channels %d compute_preemption %u\n",
			   tsg->id, tsg->tgid, tsg->timeslice_us, tsg->interleave, tsg->gpu_ns,
			   channels, tsg->compute_preemption);
	}
	spin_unlock(&engine->lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(tsgs);

static int channels_show(struct seq_file *m, void *unused)
{
	struct nvmock_gpu *gpu = m->private;
	struct nvmock_engine *engine = &gpu->engine;
	struct nvmock_tsg *tsg;
	struct nvmock_channel *ch;

	spin_lock(&engine->lock);
	list_for_each_entry(tsg, &engine->runlist, runlist_node)
		list_for_each_entry(ch, &tsg->channels, tsg_node)
			seq_printf(m, "%u tsg %u pid %d enabled %d scheduled %d faulted %d gp_get %u gpu_ns %llu gp_put %u running %d disables %u disables_max %u\n",
				   ch->chid, tsg->id, tsg->tgid, nvmock_channel_enabled(ch),
				   ch->scheduled,
				   ch->faulted, READ_ONCE(ch->userd[NVRM_USERD_GP_GET / 4]),
				   ch->gpu_ns, READ_ONCE(ch->userd[NVRM_USERD_GP_PUT / 4]),
				   ch->run_left_ns || ch->in_segment, ch->disables,
				   ch->disables_max);
	spin_unlock(&engine->lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(channels);

static int memory_show(struct seq_file *m, void *unused)
{
	struct nvmock_gpu *gpu = m->private;

	mutex_lock(&nvmock_lock);
	seq_printf(m, "fb_size %llu\nfb_used %llu\nfb_peak %llu\n", gpu->fb_size, gpu->fb_used,
		   gpu->fb_peak);
	mutex_unlock(&nvmock_lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(memory);

static ssize_t kapi_fail_write(struct file *file, const char __user *buf, size_t count,
			       loff_t *ppos)
{
	u32 hclass;
	int err = kstrtou32_from_user(buf, count, 0, &hclass);

	if (err)
		return err;
	mutex_lock(&nvmock_lock);
	nvmock_kapi.fail_class = hclass;
	nvmock_kapi.fail_armed = true;
	mutex_unlock(&nvmock_lock);
	return count;
}

static const struct file_operations kapi_fail_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = kapi_fail_write,
	.llseek = noop_llseek,
};

static ssize_t kapi_fail_control_write(struct file *file, const char __user *buf, size_t count,
				       loff_t *ppos)
{
	char text[40], acted[8] = "";
	u32 cmd, n;
	int fields;

	if (!count || count >= sizeof(text))
		return -EINVAL;
	if (copy_from_user(text, buf, count))
		return -EFAULT;
	text[count] = '\0';
	fields = sscanf(text, "%i %u %7s", &cmd, &n, acted);
	if (fields < 2 || (fields == 3 && strcmp(acted, "acted")))
		return -EINVAL;
	mutex_lock(&nvmock_lock);
	nvmock_kapi.fail_cmd = cmd;
	nvmock_kapi.fail_controls = n;
	nvmock_kapi.fail_acted = fields == 3;
	mutex_unlock(&nvmock_lock);
	return count;
}

static const struct file_operations kapi_fail_control_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = kapi_fail_control_write,
	.llseek = noop_llseek,
};

static ssize_t kapi_version_write(struct file *file, const char __user *buf, size_t count,
				  loff_t *ppos)
{
	char text[sizeof(nvmock_kapi.answer_version)];

	if (count >= sizeof(text))
		return -EINVAL;
	if (copy_from_user(text, buf, count))
		return -EFAULT;
	text[count] = '\0';
	strim(text);
	mutex_lock(&nvmock_lock);
	strscpy(nvmock_kapi.answer_version, text, sizeof(nvmock_kapi.answer_version));
	mutex_unlock(&nvmock_lock);
	return count;
}

static const struct file_operations kapi_version_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = kapi_version_write,
	.llseek = noop_llseek,
};

static ssize_t reset_write(struct file *file, const char __user *buf, size_t count,
			   loff_t *ppos)
{
	struct nvmock_gpu *gpu = file->private_data;

	nvmock_engine_reset_stats(gpu);
	mutex_lock(&nvmock_lock);
	gpu->fb_peak = gpu->fb_used;
	mutex_unlock(&nvmock_lock);
	return count;
}

static ssize_t slow_write(struct file *file, const char __user *buf, size_t count,
			  loff_t *ppos)
{
	struct nvmock_slow *slow = file->private_data;
	char text[32];
	unsigned int ms;
	int tgid;

	if (!count || count >= sizeof(text))
		return -EINVAL;
	if (copy_from_user(text, buf, count))
		return -EFAULT;
	text[count] = '\0';
	if (sscanf(text, "%d %u", &tgid, &ms) != 2 || tgid < 0 || ms > 10000)
		return -EINVAL;
	atomic_set(&slow->ms, ms);
	atomic_set(&slow->tgid, tgid);
	return count;
}

static const struct file_operations slow_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = slow_write,
	.llseek = noop_llseek,
};

static const struct file_operations reset_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.write = reset_write,
	.llseek = noop_llseek,
};

void nvmock_debugfs_init(void)
{
	unsigned int i;

	/* debugfs is for people and tests: the driver works the same without it. */
	root = debugfs_create_dir("nvmock", NULL);
	debugfs_create_file("objects", 0444, root, NULL, &objects_fops);
	debugfs_create_file("bar1", 0444, root, NULL, &bar1_fops);
	debugfs_create_file("kapi", 0444, root, NULL, &kapi_fops);
	debugfs_create_file("kapi_fail", 0200, root, NULL, &kapi_fail_fops);
	debugfs_create_file("kapi_fail_control", 0200, root, NULL, &kapi_fail_control_fops);
	debugfs_create_file("kapi_version", 0200, root, NULL, &kapi_version_fops);
	debugfs_create_file("slow_calls", 0200, root, &nvmock_slow_calls, &slow_fops);
	debugfs_create_file("slow_kapi", 0200, root, &nvmock_slow_kapi, &slow_fops);
	for (i = 0; i < nvmock_num_gpus; i++) {
		struct nvmock_gpu *gpu = &nvmock_gpus[i];
		char name[16];

		snprintf(name, sizeof(name), "gpu%u", i);
		gpu->debugfs = debugfs_create_dir(name, root);
		debugfs_create_file("engine", 0444, gpu->debugfs, gpu, &engine_fops);
		debugfs_create_file("processes", 0444, gpu->debugfs, gpu, &processes_fops);
		debugfs_create_file("tsgs", 0444, gpu->debugfs, gpu, &tsgs_fops);
		debugfs_create_file("channels", 0444, gpu->debugfs, gpu, &channels_fops);
		debugfs_create_file("memory", 0444, gpu->debugfs, gpu, &memory_fops);
		debugfs_create_file("reset", 0200, gpu->debugfs, gpu, &reset_fops);
	}
}

void nvmock_debugfs_exit(void)
{
	debugfs_remove_recursive(root);
}
