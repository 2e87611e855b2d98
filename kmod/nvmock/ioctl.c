// SPDX-License-Identifier: GPL-2.0
/*
 * nvmock: the ioctl entry point.
 *
 * As nvidia.ko does, it reads only the NR and the size of the request: an unknown NR, a size the
 * escape does not take, or an escape sent on the wrong node answers -EINVAL. The argument is
 * copied in whole and copied back whole, whatever happened, unless copying itself failed.
 * NV_ESC_IOCTL_XFER_CMD carries a larger argument by pointer.
 */
#include <linux/delay.h>
#include <linux/file.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "nvmock.h"

enum node { ANY, CTL, GPU };

struct escape_desc {
	u8 nr;
	u16 size;		/* exact size; 0: a multiple of elem */
	u16 elem;
	enum node node;
	/* Handler, or -1: known but not simulated, NV_ERR_NOT_SUPPORTED at status_off. */
	long (*handler)(struct file *file, void *arg, u32 size);
	int status_off;
};

/*
 * A test's delay (debugfs slow_calls), not the driver's behaviour: the RM_ALLOC, RM_FREE,
 * VID_HEAP_CONTROL and DUP_OBJECT calls of one thread group answer late, after the work and
 * outside nvmock_lock, as a slow round trip that holds no lock of the caller's.
 */
struct nvmock_slow nvmock_slow_calls;

/**
 * nvmock_slow_wait() - sleep as a test asked, if the caller is the one named
 * @slow: the delay a debugfs file set (slow_calls, slow_kapi)
 *
 * The id names a thread group (all its threads) or a thread (that one alone).
 *
 * Context: process context, no lock held.
 */
void nvmock_slow_wait(struct nvmock_slow *slow)
{
	pid_t id = atomic_read(&slow->tgid);

	if (id && (id == task_tgid_nr(current) || id == task_pid_nr(current)))
		msleep_interruptible(atomic_read(&slow->ms));
}

static void slow_answer(void)
{
	nvmock_slow_wait(&nvmock_slow_calls);
}

static struct file *control_file(struct file *file)
{
	struct nvmock_file *nf = nvmock_file_of(file);

	/* RM clients belong to the control file a GPU file was registered with, if any. */
	return nf->ctl ? nf->ctl : file;
}

static long esc_rm_alloc(struct file *file, void *arg, u32 size)
{
	struct nvmock_caller caller = { .file = control_file(file) };
	struct nvos21_params *p = arg;	/* the first five fields are shared with NVOS64 */
	u32 *status = size == sizeof(struct nvos64_params) ?
		      &((struct nvos64_params *)arg)->status : &p->status;

	mutex_lock(&nvmock_lock);
	*status = nvmock_rm_alloc(&caller, p->hRoot, p->hObjectParent, &p->hObjectNew, p->hClass,
				  u64_to_user_ptr(p->pAllocParms), NULL);
	mutex_unlock(&nvmock_lock);
	/* RM answers the root classes as NV01_ROOT_CLIENT. */
	if (*status == NV_OK && (p->hClass == NV01_ROOT || p->hClass == NV01_ROOT_NON_PRIV))
		p->hClass = NV01_ROOT_CLIENT;
	slow_answer();
	return 0;
}

static long esc_rm_free(struct file *file, void *arg, u32 size)
{
	struct nvmock_caller caller = { .file = control_file(file) };
	struct nvos00_params *p = arg;

	mutex_lock(&nvmock_lock);
	p->status = nvmock_rm_free(&caller, p->hRoot, p->hObjectParent, p->hObjectOld);
	mutex_unlock(&nvmock_lock);
	slow_answer();
	return 0;
}

static long esc_rm_control(struct file *file, void *arg, u32 size)
{
	struct nvmock_caller caller = { .file = control_file(file) };
	struct nvos54_params *p = arg;

	mutex_lock(&nvmock_lock);
	p->status = nvmock_rm_control(&caller, p, false);
	mutex_unlock(&nvmock_lock);
	return 0;
}

/* A field of NVOS32's union by its offset (nvrm.h's NVRM_NVOS32_*_OFF). */
static void *nvos32_at(struct nvos32_params *p, unsigned int off)
{
	return (u8 *)p + off;
}

/*
 * An allocating function's memory as _rmVidHeapControlAllocCommon makes it
 * (src/nvidia/interface/deprecated/rmapi_deprecated_vidheapctrl.c): an RM_ALLOC under
 * hObjectParent of NV01_MEMORY_LOCAL_USER for attr LOCATION VIDMEM, else NV01_MEMORY_SYSTEM
 * (NV50_MEMORY_VIRTUAL for ALLOC_FLAGS_VIRTUAL and EGM are not modelled: NV_ERR_NOT_SUPPORTED),
 * at hMemory with MEMORY_HANDLE_PROVIDED, else at a handle RM picks and writes back; total and
 * free are set to 0. @mem holds the function's fields going in and RM's answer coming out.
 */
static void vid_heap_alloc(struct file *file, struct nvos32_params *p,
			   struct nv_memory_alloc_params *mem)
{
	struct nvmock_caller caller = { .file = control_file(file) };
	u32 location = (mem->attr >> NVOS32_ATTR_LOCATION_SHIFT) & NVOS32_ATTR_LOCATION_MASK;
	u32 hclass = location == NVOS32_ATTR_LOCATION_VIDMEM ? NV01_MEMORY_LOCAL_USER :
		     NV01_MEMORY_SYSTEM;
	u32 hmem;

	if (mem->flags & NVOS32_ALLOC_FLAGS_VIRTUAL) {
		p->status = NV_ERR_NOT_SUPPORTED;
		return;
	}
	hmem = mem->flags & NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED ? p->hMemory : 0;
	mem->owner = p->owner;
	mem->type = p->type;
	mem->hVASpace = p->hVASpace;
	mutex_lock(&nvmock_lock);
	p->status = nvmock_rm_alloc(&caller, p->hRoot, p->hObjectParent, &hmem, hclass, NULL, mem);
	mutex_unlock(&nvmock_lock);
	p->hMemory = hmem;
	p->total = 0;
	p->free = 0;
}

/*
 * VID_HEAP_CONTROL (RmDeprecatedVidHeapControl, rmapi_deprecated_vidheapctrl.c): a function not
 * in its table is NV_ERR_INVALID_ARGUMENT. Modelled, with each function's fields where nvos.h's
 * union has them: ALLOC_SIZE (_nvos32FunctionAllocSize), ALLOC_SIZE_RANGE
 * (_nvos32FunctionAllocSizeRange; the range itself is not modelled: nvmock places memory its own
 * way), ALLOC_TILED_PITCH_HEIGHT (_nvos32FunctionAllocTiledPitchHeight: size = height * pitch,
 * pitch signed), each answering size, offset, limit and attr (and attr2 and format where the
 * function's fields have them, _IN_OUT in its table) and partitionStride 256; FREE
 * (_nvos32FunctionFree: NV_ERR_INVALID_ARGUMENT without FREE_FLAGS_MEMORY_HANDLE_PROVIDED, else
 * RM_FREE of hMemory in hRoot); INFO (_nvos32FunctionInfo: total and free of the GPU's memory).
 * Measured on an H100 (580.159.04; tests/vm/rmcases.py vid_heap_control and vid_heap_functions):
 * each allocating function made memory at hMemory, rounded as RM_ALLOC rounds it; FREE freed it,
 * a handle freed twice NV_OK; INFO NV_OK; function 99 NV_ERR_INVALID_ARGUMENT. The table's other
 * functions (compression, alignment, HW resources, OS descriptors): NV_ERR_NOT_SUPPORTED, not
 * modelled.
 */
static long esc_rm_vid_heap_control(struct file *file, void *arg, u32 size)
{
	struct nvmock_caller caller = { .file = control_file(file) };
	struct nvos32_params *p = arg;
	struct nv_memory_alloc_params mem = { 0 };
	u64 *range_size = nvos32_at(p, NVRM_NVOS32_RANGE_SIZE_OFF);
	u32 *tiled_attr = nvos32_at(p, NVRM_NVOS32_TILED_ATTR_OFF);
	u32 *tiled_attr2 = nvos32_at(p, NVRM_NVOS32_TILED_ATTR2_OFF);
	u32 *tiled_format = nvos32_at(p, NVRM_NVOS32_TILED_FORMAT_OFF);
	u32 height = *(u32 *)nvos32_at(p, NVRM_NVOS32_TILED_HEIGHT_OFF);
	s32 pitch = *(s32 *)nvos32_at(p, NVRM_NVOS32_TILED_PITCH_OFF);

	switch (p->function) {
	case NVOS32_FUNCTION_ALLOC_SIZE:
		mem.flags = p->flags;
		mem.width = p->width;
		mem.height = p->height;
		mem.attr = p->attr;
		mem.attr2 = p->attr2;
		mem.format = p->format;
		mem.size = p->size;
		mem.alignment = p->alignment;
		mem.offset = p->offset;
		mem.numaNode = p->numaNode;
		vid_heap_alloc(file, p, &mem);
		p->partitionStride = 256;
		if (p->status == NV_OK) {
			p->size = mem.size;
			p->offset = mem.offset;
			p->limit = mem.limit;
			p->attr = mem.attr;
			p->attr2 = mem.attr2;
			p->format = mem.format;
		}
		break;
	case NVOS32_FUNCTION_ALLOC_SIZE_RANGE:
		mem.flags = p->flags;
		mem.attr = p->attr;
		mem.attr2 = *(u32 *)nvos32_at(p, NVRM_NVOS32_RANGE_ATTR2_OFF);
		mem.format = p->format;
		mem.size = *range_size;
		vid_heap_alloc(file, p, &mem);
		p->partitionStride = 256;
		if (p->status == NV_OK) {
			*range_size = mem.size;
			*(u64 *)nvos32_at(p, NVRM_NVOS32_RANGE_OFFSET_OFF) = mem.offset;
			*(u64 *)nvos32_at(p, NVRM_NVOS32_RANGE_LIMIT_OFF) = mem.limit;
			p->attr = mem.attr;
			*(u32 *)nvos32_at(p, NVRM_NVOS32_RANGE_ATTR2_OFF) = mem.attr2;
		}
		break;
	case NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT:
		/* (NvU64)height * pitch: a negative pitch is a size past any GPU's memory. */
		p->size = (u64)height * (u64)(s64)pitch;
		mem.flags = p->flags;
		mem.width = *(u32 *)nvos32_at(p, NVRM_NVOS32_TILED_WIDTH_OFF);
		mem.height = height;
		mem.pitch = pitch;
		mem.attr = *tiled_attr;
		mem.attr2 = *tiled_attr2;
		mem.format = *tiled_format;
		mem.size = p->size;
		mem.alignment = *(u64 *)nvos32_at(p, NVRM_NVOS32_TILED_ALIGNMENT_OFF);
		vid_heap_alloc(file, p, &mem);
		*(u32 *)nvos32_at(p, NVRM_NVOS32_TILED_STRIDE_OFF) = 256;
		if (p->status == NV_OK) {
			p->size = mem.size;
			p->offset = mem.offset;
			p->limit = mem.limit;
			*tiled_attr = mem.attr;
			*tiled_attr2 = mem.attr2;
			*tiled_format = mem.format;
		}
		break;
	case NVOS32_FUNCTION_FREE:
		if (!(*(u32 *)nvos32_at(p, NVRM_NVOS32_FREE_FLAGS_OFF) &
		      NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED)) {
			p->status = NV_ERR_INVALID_ARGUMENT;
			break;
		}
		mutex_lock(&nvmock_lock);
		p->status = nvmock_rm_free(&caller, p->hRoot, p->hRoot, p->hMemory);
		mutex_unlock(&nvmock_lock);
		break;
	case NVOS32_FUNCTION_INFO:
		mutex_lock(&nvmock_lock);
		p->status = nvmock_heap_info(&caller, p->hRoot, p->hObjectParent, &p->total,
					     &p->free);
		mutex_unlock(&nvmock_lock);
		break;
	case 15:	/* REACQUIRE_COMPR */
	case 16:	/* RELEASE_COMPR */
	case 18:	/* GET_MEM_ALIGNMENT */
	case 19:	/* HW_ALLOC */
	case 20:	/* HW_FREE */
	case 27:	/* ALLOC_OS_DESCRIPTOR */
		p->status = NV_ERR_NOT_SUPPORTED;
		break;
	default:
		p->status = NV_ERR_INVALID_ARGUMENT;
		break;
	}
	slow_answer();
	return 0;
}

static long esc_rm_dup_object(struct file *file, void *arg, u32 size)
{
	struct nvmock_caller caller = { .file = control_file(file) };
	struct nvos55_params *p = arg;

	mutex_lock(&nvmock_lock);
	p->status = nvmock_rm_dup(&caller, p->hClient, p->hParent, &p->hObject, p->hClientSrc,
				  p->hObjectSrc);
	mutex_unlock(&nvmock_lock);
	slow_answer();
	return 0;
}

static long esc_rm_map_memory(struct file *file, void *arg, u32 size)
{
	struct nvos33_params_with_fd *p = arg;

	mutex_lock(&nvmock_lock);
	p->status = nvmock_map_memory(file, p);
	mutex_unlock(&nvmock_lock);
	return 0;
}

static long esc_card_info(struct file *file, void *arg, u32 size)
{
	struct nvrm_card_info *cards = arg;
	u32 i, n = size / sizeof(*cards);

	memset(arg, 0, size);
	for (i = 0; i < n && i < nvmock_num_gpus; i++) {
		struct nvmock_gpu *gpu = &nvmock_gpus[i];

		cards[i].valid = 1;
		cards[i].bus = gpu->gpu_id >> 8;
		cards[i].vendor_id = 0x10DE;
		cards[i].device_id = 0x2335;	/* H200 */
		cards[i].gpu_id = gpu->gpu_id;
		cards[i].fb_size = gpu->fb_size;
		cards[i].minor_number = gpu->index;
		snprintf(cards[i].dev_name, sizeof(cards[i].dev_name), "nvmock%u", gpu->index);
	}
	return 0;
}

static long esc_register_fd(struct file *file, void *arg, u32 size)
{
	struct nvmock_file *nf = nvmock_file_of(file);
	struct nvrm_register_fd *p = arg;
	struct file *ctl;
	long ret = 0;

	ctl = fget(p->ctl_fd);
	if (!ctl)
		return -EINVAL;
	if (ctl == file || ctl->f_op != &nvmock_fops || nvmock_file_of(ctl)->gpu) {
		fput(ctl);
		return -EINVAL;
	}
	mutex_lock(&nvmock_lock);
	if (nf->ctl)
		ret = -EINVAL;	/* registered once per file */
	else
		nf->ctl = ctl;
	mutex_unlock(&nvmock_lock);
	if (ret)
		fput(ctl);
	return ret;
}

static long esc_check_version(struct file *file, void *arg, u32 size)
{
	struct nvrm_api_version *p = arg;
	const char *mine = NVMOCK_VERSION_STRING;
	size_t n = sizeof(p->version);

	p->version[n - 1] = '\0';
	switch (p->cmd) {
	case NVRM_VERSION_CHECK_QUERY:
		strscpy(p->version, mine, n);
		p->reply = NVRM_VERSION_REPLY_RECOGNIZED;
		return 0;
	case NVRM_VERSION_CHECK_RELAXED:
		n = strcspn(mine, ".");
		if (!strncmp(p->version, mine, n) && (p->version[n] == '.' || !p->version[n]))
			goto recognized;
		break;
	default:
		if (!strcmp(p->version, mine))
			goto recognized;
		break;
	}
	/* A mismatch fails the ioctl, with the driver's own version in the reply. */
	strscpy(p->version, mine, sizeof(p->version));
	p->reply = 0;
	return -EINVAL;
recognized:
	p->reply = NVRM_VERSION_REPLY_RECOGNIZED;
	return 0;
}

static long esc_attach_gpus(struct file *file, void *arg, u32 size)
{
	struct nvmock_file *nf = nvmock_file_of(file);
	const u32 *ids = arg;
	u32 i, j, n = size / sizeof(*ids);
	long ret = 0;

	for (i = 0; i < n; i++) {
		if (!ids[i])
			continue;
		for (j = 0; j < nvmock_num_gpus; j++)
			if (nvmock_gpus[j].gpu_id == ids[i])
				break;
		if (j == nvmock_num_gpus)
			return -ENODEV;
	}
	mutex_lock(&nvmock_lock);
	if (nf->attached)
		ret = -EINVAL;	/* once per file */
	nf->attached = true;
	mutex_unlock(&nvmock_lock);
	return ret;
}

static long esc_sys_params(struct file *file, void *arg, u32 size)
{
	return 0;
}

static long esc_wait_open_complete(struct file *file, void *arg, u32 size)
{
	struct nvrm_wait_open_complete *p = arg;

	p->rc = 0;
	p->adapter_status = NV_OK;
	return 0;
}

static const struct escape_desc escapes[] = {
	{ NV_ESC_RM_ALLOC_MEMORY, 56, 0, GPU, NULL, 40 },
	{ NV_ESC_RM_ALLOC_OBJECT, 20, 0, CTL, NULL, 16 },
	{ NV_ESC_RM_FREE, sizeof(struct nvos00_params), 0, CTL, esc_rm_free, 0 },
	{ NV_ESC_RM_CONTROL, sizeof(struct nvos54_params), 0, CTL, esc_rm_control, 0 },
	{ NV_ESC_RM_ALLOC, sizeof(struct nvos21_params), 0, CTL, esc_rm_alloc, 0 },
	{ NV_ESC_RM_ALLOC, sizeof(struct nvos64_params), 0, CTL, esc_rm_alloc, 0 },
	{ NV_ESC_RM_DUP_OBJECT, sizeof(struct nvos55_params), 0, CTL, esc_rm_dup_object, 0 },
	{ NV_ESC_RM_SHARE, 24, 0, CTL, NULL, 20 },
	{ NV_ESC_RM_I2C_ACCESS, 32, 0, GPU, NULL, -1 },
	{ NV_ESC_RM_IDLE_CHANNELS, 56, 0, CTL, NULL, -1 },
	{ NV_ESC_RM_VID_HEAP_CONTROL, sizeof(struct nvos32_params), 0, CTL,
	  esc_rm_vid_heap_control, 0 },
	{ NV_ESC_RM_ACCESS_REGISTRY, 72, 0, CTL, NULL, -1 },
	{ NV_ESC_RM_MAP_MEMORY, sizeof(struct nvos33_params_with_fd), 0, CTL,
	  esc_rm_map_memory, 0 },
	{ NV_ESC_RM_UNMAP_MEMORY, 32, 0, CTL, NULL, 24 },
	{ NV_ESC_RM_GET_EVENT_DATA, 16, 0, ANY, NULL, 12 },
	{ NV_ESC_RM_ALLOC_CONTEXT_DMA2, 56, 0, CTL, NULL, -1 },
	{ NV_ESC_RM_MAP_MEMORY_DMA, 64, 0, CTL, NULL, -1 },
	{ NV_ESC_RM_UNMAP_MEMORY_DMA, 48, 0, CTL, NULL, -1 },
	{ NV_ESC_RM_BIND_CONTEXT_DMA, 16, 0, CTL, NULL, 12 },
	{ NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO, 40, 0, CTL, NULL, 32 },
	{ NV_ESC_CARD_INFO, 0, sizeof(struct nvrm_card_info), CTL, esc_card_info, 0 },
	{ NV_ESC_REGISTER_FD, sizeof(struct nvrm_register_fd), 0, ANY, esc_register_fd, 0 },
	{ NV_ESC_ALLOC_OS_EVENT, sizeof(struct nvrm_os_event), 0, ANY, NULL, 12 },
	{ NV_ESC_FREE_OS_EVENT, sizeof(struct nvrm_os_event), 0, ANY, NULL, 12 },
	{ NV_ESC_STATUS_CODE, 12, 0, CTL, NULL, 8 },
	{ NV_ESC_CHECK_VERSION_STR, sizeof(struct nvrm_api_version), 0, CTL,
	  esc_check_version, 0 },
	{ NV_ESC_ATTACH_GPUS_TO_FD, 0, sizeof(u32), CTL, esc_attach_gpus, 0 },
	{ NV_ESC_QUERY_DEVICE_INTR, 8, 0, GPU, NULL, 4 },
	{ NV_ESC_SYS_PARAMS, sizeof(struct nvrm_sys_params), 0, CTL, esc_sys_params, 0 },
	{ NV_ESC_NUMA_INFO, 560, 0, GPU, NULL, 4 },
	{ NV_ESC_SET_NUMA_STATUS, 4, 0, GPU, NULL, -1 },
	{ NV_ESC_EXPORT_TO_DMABUF_FD, sizeof(struct nvrm_export_dmabuf_fd), 0, GPU,
	  nvmock_export_dmabuf, 0 },
	{ NV_ESC_WAIT_OPEN_COMPLETE, sizeof(struct nvrm_wait_open_complete), 0, ANY,
	  esc_wait_open_complete, 0 },
};

static const struct escape_desc *find_escape(u32 nr, u32 size)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(escapes); i++) {
		const struct escape_desc *d = &escapes[i];

		if (d->nr == nr && (d->size ? size == d->size : size && size % d->elem == 0))
			return d;
	}
	return NULL;
}

/*
 * The escapes nvidia_ioctl answers itself (kernel-open/nvidia/nv.c: WAIT_OPEN_COMPLETE before
 * its switch, then the switch's cases); every other one goes to rm_ioctl with the kernel copy.
 */
static bool answered_by_nv_c(u32 nr)
{
	switch (nr) {
	case NV_ESC_WAIT_OPEN_COMPLETE:
	case NV_ESC_QUERY_DEVICE_INTR:
	case NV_ESC_CARD_INFO:
	case NV_ESC_ATTACH_GPUS_TO_FD:
	case NV_ESC_CHECK_VERSION_STR:
	case NV_ESC_SYS_PARAMS:
	case NV_ESC_NUMA_INFO:
	case NV_ESC_SET_NUMA_STATUS:
	case NV_ESC_EXPORT_TO_DMABUF_FD:
		return true;
	}
	return false;
}

static long run_escape(struct file *file, const struct escape_desc *d, void *arg, u32 size)
{
	if (d->handler)
		return d->handler(file, arg, size);
	if (d->status_off >= 0)
		*(u32 *)(arg + d->status_off) = NV_ERR_NOT_SUPPORTED;
	return 0;
}

/**
 * rm_ioctl() - the driver's RM entry, with the one kernel copy of a request's argument
 * @sp: the driver's alternate stack (none in nvmock)
 * @nv: the GPU's state (nvmock finds it from @nvfp)
 * @nvfp: the open file
 * @cmd: the escape number
 * @data: nvidia_ioctl's kernel copy of the argument, copied back out after the call
 * @size: its size
 *
 * Named and shaped as the driver's (src/nvidia/arch/nvalloc/unix/src/osapi.c: rm_ioctl, called
 * from nv.c's nvidia_ioctl for every escape it does not answer itself), so that a probe on it
 * sees in nvmock what it would see in nvidia.ko. It returns what the escape's handler returns
 * (0 or a negative errno) where RM returns an NV_STATUS that nvidia_ioctl turns into -EINVAL.
 *
 * Return: 0, or a negative errno.
 */
noinline long rm_ioctl(void *sp, void *nv, struct file *nvfp, u32 cmd, void *data, u32 size)
{
	const struct escape_desc *d = find_escape(cmd, size);

	return d ? run_escape(nvfp, d, data, size) : -EINVAL;
}

static long dispatch(struct file *file, u32 nr, u32 size, void __user *uarg)
{
	struct nvmock_file *nf = nvmock_file_of(file);
	const struct escape_desc *d;
	void *arg;
	long ret;

	d = find_escape(nr, size);
	if (!d)
		return -EINVAL;
	if ((d->node == CTL && nf->gpu) || (d->node == GPU && !nf->gpu))
		return -EINVAL;
	arg = kmalloc(size, GFP_KERNEL);
	if (!arg)
		return -ENOMEM;
	if (copy_from_user(arg, uarg, size)) {
		kfree(arg);
		return -EFAULT;
	}
	if (answered_by_nv_c(nr))
		ret = run_escape(file, d, arg, size);
	else
		ret = rm_ioctl(NULL, NULL, file, nr, arg, size);
	if (copy_to_user(uarg, arg, size))
		ret = -EFAULT;
	kfree(arg);
	return ret;
}

long nvmock_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	void __user *uarg = (void __user *)arg;
	struct nvrm_xfer xfer;

	if (_IOC_NR(cmd) != NV_ESC_IOCTL_XFER_CMD)
		return dispatch(file, _IOC_NR(cmd), _IOC_SIZE(cmd), uarg);
	/* The indirection: the real request, its size and its argument by pointer. */
	if (_IOC_SIZE(cmd) != sizeof(xfer))
		return -EINVAL;
	if (copy_from_user(&xfer, uarg, sizeof(xfer)))
		return -EFAULT;
	if (xfer.size > NVRM_MAX_IOCTL_SIZE || xfer.cmd == NV_ESC_IOCTL_XFER_CMD)
		return -EINVAL;
	return dispatch(file, xfer.cmd, xfer.size, u64_to_user_ptr(xfer.ptr));
}
