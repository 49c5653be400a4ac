"""PyTorch's ImageNet example (pytorch/examples, imagenet/main.py) with lsgd-torch's objects in it.

The same script, flags and checkpoint, changed only where docs/pytorch.md says; every change is
marked `# lsgd:` so that the diff is easy to read:

- the learning rate comes from a schedule plugin (`--schedule warmup`, Goyal et al.'s warmup and
  step decay), a `WasmLR` stepped every iteration, instead of `StepLR` stepped every epoch;
- `--codec codec-top-k --codec-param density=0.01` compresses DDP's gradients through a codec
  plugin (`CodecState` + `codec_hook`), with error feedback;
- the checkpoint also keeps the scheduler's state and each rank's codec state, and
  `torch.load(weights_only=True)` (torch's default) reads them back: a resumed run continues bit
  for bit;
- `check_ranks()` proves at the end that every rank ran the same plugins to the same step.

CPU and gloo, started by torchrun as main.py is:

    torchrun --nproc_per_node 2 examples/python/imagenet_main.py --dummy -a resnet18 \\
        --image-size 64 --dummy-samples 512 -b 32 --epochs 2 --codec codec-top-k \\
        --codec-param density=0.01 -j 0

`--dummy` trains on torchvision's FakeData (as in main.py); `--image-size`, `--dummy-samples`,
`--stop-epoch` and `--loss-log` are this copy's, for a test that stops, resumes and compares.
"""

import argparse
import json
import os
import shutil
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim
import torch.utils.data
import torch.utils.data.distributed
import torchvision.datasets as datasets
import torchvision.models as models
import torchvision.transforms as transforms

import lsgd_torch  # lsgd:
from lsgd_torch import CodecState, WasmLR, codec_hook  # lsgd:

model_names = sorted(name for name in models.__dict__
                     if name.islower() and not name.startswith("__")
                     and callable(models.__dict__[name]))

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training (lsgd-torch plugins)")
parser.add_argument("data", metavar="DIR", nargs="?", default="imagenet",
                    help="path to dataset (default: imagenet)")
parser.add_argument("-a", "--arch", metavar="ARCH", default="resnet18", choices=model_names,
                    help="model architecture: " + " | ".join(model_names))
parser.add_argument("-j", "--workers", default=4, type=int, metavar="N",
                    help="number of data loading workers (default: 4)")
parser.add_argument("--epochs", default=90, type=int, metavar="N",
                    help="number of total epochs to run")
parser.add_argument("--start-epoch", default=0, type=int, metavar="N",
                    help="manual epoch number (useful on restarts)")
parser.add_argument("-b", "--batch-size", default=256, type=int, metavar="N",
                    help="mini-batch size (default: 256), the total of all ranks")
parser.add_argument("--lr", "--learning-rate", default=0.1, type=float, metavar="LR",
                    help="initial learning rate", dest="lr")
parser.add_argument("--momentum", default=0.9, type=float, metavar="M", help="momentum")
parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float, metavar="W",
                    help="weight decay (default: 1e-4)", dest="weight_decay")
parser.add_argument("-p", "--print-freq", default=10, type=int, metavar="N",
                    help="print frequency (default: 10)")
parser.add_argument("--resume", default="", type=str, metavar="PATH",
                    help="path to latest checkpoint (default: none)")
parser.add_argument("-e", "--evaluate", dest="evaluate", action="store_true",
                    help="evaluate model on validation set")
parser.add_argument("--dist-backend", default="gloo", type=str, help="distributed backend")
parser.add_argument("--seed", default=0, type=int, help="seed for initializing training")
parser.add_argument("--dummy", action="store_true", help="use fake data to benchmark")
# lsgd: the policies, by plugin name (the reference plugins ship in the wheel) or path.
parser.add_argument("--schedule", default="warmup", help="schedule plugin (default: warmup)")
parser.add_argument("--schedule-param", action="append", default=[], metavar="KEY=VALUE",
                    help="a schedule plugin parameter (repeatable)")
parser.add_argument("--codec", default=None, help="codec plugin for DDP's gradients")
parser.add_argument("--codec-param", action="append", default=[], metavar="KEY=VALUE",
                    help="a codec plugin parameter (repeatable)")
# lsgd: what a test of stop-and-resume needs; not in main.py.
parser.add_argument("--image-size", default=224, type=int, help="fake image side (--dummy)")
parser.add_argument("--dummy-samples", default=1281167, type=int,
                    help="fake training images (--dummy; validation gets a tenth)")
parser.add_argument("--stop-epoch", default=None, type=int,
                    help="stop after this many epochs, as a preempted job would")
parser.add_argument("--loss-log", default=None, help="rank 0 writes each step's loss here (jsonl)")

best_acc1 = 0


def pairs(items):
    """KEY=VALUE strings as a dict (the plugin checks the values' types)."""
    return dict(item.split("=", 1) for item in items)


def main():
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    # torchrun's environment, as main.py's --dist-url env:// reads it.
    args.world_size = int(os.environ.get("WORLD_SIZE", 1))
    args.rank = int(os.environ.get("RANK", 0))
    args.distributed = args.world_size > 1
    if args.distributed:
        dist.init_process_group(backend=args.dist_backend, init_method="env://")
    main_worker(args)
    if args.distributed:
        lsgd_torch.exit_ranks()  # lsgd: ends gloo's ranks without torch's abort at exit


def main_worker(args):
    global best_acc1
    print(f"=> creating model '{args.arch}'")
    model = models.__dict__[args.arch]()
    codec_state = None
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
        if args.codec:  # lsgd: the codec plugin as DDP's comm hook
            if args.resume and os.path.isfile(rank_file(args.resume, args.rank)):
                # This rank's residuals and codec states, as PowerSGD's state is reloaded.
                codec_state = torch.load(rank_file(args.resume, args.rank))
                codec_state.set_names(model)
            else:
                codec_state = CodecState(None, args.codec, params=pairs(args.codec_param),
                                         seed=args.seed, names=model)
            model.register_comm_hook(codec_state, codec_hook)
    # The batch of each rank, as main.py divides it among the processes.
    per_rank = args.batch_size // args.world_size

    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)

    if args.dummy:
        print("=> Dummy data is used!")
        shape = (3, args.image_size, args.image_size)
        train_dataset = datasets.FakeData(args.dummy_samples, shape, 1000,
                                          transforms.ToTensor())
        val_dataset = datasets.FakeData(max(1, args.dummy_samples // 10), shape, 1000,
                                        transforms.ToTensor(), random_offset=args.dummy_samples)
    else:
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406],
                                         std=[0.229, 0.224, 0.225])
        train_dataset = datasets.ImageFolder(os.path.join(args.data, "train"), transforms.Compose([
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]))
        val_dataset = datasets.ImageFolder(os.path.join(args.data, "val"), transforms.Compose([
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            normalize,
        ]))

    if args.distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset,
                                                                        seed=args.seed)
        val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False,
                                                                      drop_last=True)
    else:
        train_sampler = None
        val_sampler = None
    # lsgd: a resumed run draws the same order: the shuffle's generator is reseeded per epoch.
    order = torch.Generator()
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=per_rank, shuffle=(train_sampler is None), generator=order,
        num_workers=args.workers, sampler=train_sampler, drop_last=True)
    val_loader = torch.utils.data.DataLoader(
        val_dataset, batch_size=per_rank, shuffle=False, num_workers=args.workers,
        sampler=val_sampler)

    # lsgd: main.py's StepLR(step_size=30, gamma=0.1), stepped per epoch, becomes a schedule
    # plugin stepped per iteration; its state goes into the checkpoint beside the optimizer's.
    scheduler = WasmLR(optimizer, args.schedule, steps_per_epoch=len(train_loader),
                       epochs=args.epochs, global_batch=per_rank * args.world_size,
                       world_size=args.world_size, params=pairs(args.schedule_param))

    if args.resume:
        if os.path.isfile(args.resume):
            print(f"=> loading checkpoint '{args.resume}'")
            # torch's default weights_only=True: lsgd-torch's states are allowed globals.
            checkpoint = torch.load(args.resume)
            args.start_epoch = checkpoint["epoch"]
            best_acc1 = checkpoint["best_acc1"]
            model.load_state_dict(checkpoint["state_dict"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            scheduler.load_state_dict(checkpoint["scheduler"])  # lsgd:
            print(f"=> loaded checkpoint '{args.resume}' (epoch {checkpoint['epoch']})")
        else:
            print(f"=> no checkpoint found at '{args.resume}'")

    if args.evaluate:
        validate(val_loader, model, criterion, args)
        return

    log = open(args.loss_log, "a") if args.loss_log and args.rank == 0 else None
    stop = args.epochs if args.stop_epoch is None else min(args.epochs, args.stop_epoch)
    for epoch in range(args.start_epoch, stop):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        order.manual_seed(args.seed + epoch)

        train(train_loader, model, criterion, optimizer, scheduler, epoch, args, log)
        acc1 = validate(val_loader, model, criterion, args)

        is_best = acc1 > best_acc1
        best_acc1 = max(acc1, best_acc1)
        state = {
            "epoch": epoch + 1,
            "arch": args.arch,
            "state_dict": model.state_dict(),
            "best_acc1": best_acc1,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
        }
        if args.rank == 0:
            save_checkpoint(state, is_best)
        if codec_state is not None:  # lsgd: each rank keeps its own residuals
            torch.save(codec_state, rank_file("checkpoint.pth.tar", args.rank))
    if log is not None:
        digest = lsgd_torch.blake3_hex(b"".join(
            p.detach().numpy().tobytes() for p in model.state_dict().values()))
        log.write(json.dumps({"params": digest}) + "\n")
        log.close()
    lsgd_torch.check_ranks()  # lsgd: every rank ran the same plugins to the same step


def rank_file(checkpoint, rank):
    """Where rank `rank` keeps its codec state beside `checkpoint`."""
    return f"{checkpoint}.codec-rank{rank}"


def train(train_loader, model, criterion, optimizer, scheduler, epoch, args, log):
    batch_time = AverageMeter("Time", ":6.3f")
    data_time = AverageMeter("Data", ":6.3f")
    losses = AverageMeter("Loss", ":.4e")
    top1 = AverageMeter("Acc@1", ":6.2f")
    top5 = AverageMeter("Acc@5", ":6.2f")
    progress = ProgressMeter(len(train_loader), [batch_time, data_time, losses, top1, top5],
                             prefix=f"Epoch: [{epoch}]")
    model.train()
    end = time.time()
    for i, (images, target) in enumerate(train_loader):
        data_time.update(time.time() - end)
        output = model(images)
        loss = criterion(output, target)
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        losses.update(loss.item(), images.size(0))
        top1.update(acc1[0], images.size(0))
        top5.update(acc5[0], images.size(0))

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.observe(loss=loss)  # lsgd: last-loss, for a plugin that watches it
        scheduler.step()  # lsgd: per iteration
        if log is not None:
            log.write(json.dumps({"epoch": epoch, "step": i, "loss": loss.item().hex(),
                                  "lr": optimizer.param_groups[0]["lr"]}) + "\n")

        batch_time.update(time.time() - end)
        end = time.time()
        if i % args.print_freq == 0:
            progress.display(i + 1)


def validate(val_loader, model, criterion, args):
    batch_time = AverageMeter("Time", ":6.3f")
    losses = AverageMeter("Loss", ":.4e")
    top1 = AverageMeter("Acc@1", ":6.2f")
    top5 = AverageMeter("Acc@5", ":6.2f")
    progress = ProgressMeter(len(val_loader), [batch_time, losses, top1, top5], prefix="Test: ")
    model.eval()
    with torch.no_grad():
        end = time.time()
        for i, (images, target) in enumerate(val_loader):
            output = model(images)
            loss = criterion(output, target)
            acc1, acc5 = accuracy(output, target, topk=(1, 5))
            losses.update(loss.item(), images.size(0))
            top1.update(acc1[0], images.size(0))
            top5.update(acc5[0], images.size(0))
            batch_time.update(time.time() - end)
            end = time.time()
            if i % args.print_freq == 0:
                progress.display(i + 1)
    if args.distributed:
        top1.all_reduce()
        top5.all_reduce()
    progress.display_summary()
    return top1.avg


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


class AverageMeter:
    """Computes and stores the average and current value."""

    def __init__(self, name, fmt=":f"):
        self.name, self.fmt = name, fmt
        self.val = self.avg = self.sum = self.count = 0

    def update(self, val, n=1):
        self.val = float(val)
        self.sum += float(val) * n
        self.count += n
        self.avg = self.sum / self.count

    def all_reduce(self):
        total = torch.tensor([self.sum, self.count], dtype=torch.float64)
        dist.all_reduce(total)
        self.sum, self.count = total.tolist()
        self.avg = self.sum / max(self.count, 1)

    def __str__(self):
        return ("{name} {val" + self.fmt + "} ({avg" + self.fmt + "})").format(**self.__dict__)


class ProgressMeter:
    """Prints the meters of a batch, and the averages at the end."""

    def __init__(self, num_batches, meters, prefix=""):
        width = len(str(num_batches))
        self.batch_fmt = "[{:" + str(width) + "d}/" + str(num_batches) + "]"
        self.meters, self.prefix = meters, prefix

    def display(self, batch):
        print("\t".join([self.prefix + self.batch_fmt.format(batch)]
                        + [str(m) for m in self.meters]))

    def display_summary(self):
        print(" * " + " ".join(f"{m.name} {m.avg:.3f}" for m in self.meters[1:]))


def accuracy(output, target, topk=(1,)):
    """The accuracy over the k top predictions, for each k."""
    with torch.no_grad():
        maxk = max(topk)
        _, pred = output.topk(maxk, 1, True, True)
        correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
        return [correct[:k].reshape(-1).float().sum(0, keepdim=True) * (100.0 / target.size(0))
                for k in topk]


if __name__ == "__main__":
    main()
