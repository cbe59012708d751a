import os, mmap, random, sys
path, size = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 4096)
blocks = list(range(0, size // 4096, 2))
random.seed(7); random.shuffle(blocks)
for b in blocks:
    os.preadv(fd, [buf], b * 4096)
os.close(fd)
