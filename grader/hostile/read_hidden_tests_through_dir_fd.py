"""Read the kernel's own notebook (its test cells restored, hidden tests included) past the
guard: keep a descriptor of the kernel's folder, change to another folder, then open every
notebook found there by its bare name relative to that descriptor (``os.open(name,
dir_fd=fd)``), and print what the hidden tests hold, so it lands in the feedback.

Expected: the kernel's folder holds no notebook (the kernel runs in a folder of its own, a
copy of the student's other files), so there is nothing to open; were one there, the guard
resolves the bare name against every folder the kernel holds open and refuses it. Nothing of
the hidden tests is printed. The answers are the solution's, so every task counts normally.
"""
OUTPUT_CONTAINS = ["notebooks beside the kernel: []"]
OUTPUT_EXCLUDES = ["6f6e655f6770755f7365636f6e6473"]  # "one_gpu_seconds" (a hidden test's line), hex-encoded
AFFECTED = []
EXTRA_CELLS = [("concepts-answer", r'''import glob, os, re

_here = os.open(".", os.O_RDONLY)
_names = glob.glob("*.ipynb")
print("notebooks beside the kernel:", _names)
os.chdir("/")
for _name in _names:
    try:
        _fd = os.open(_name, os.O_RDONLY, dir_fd=_here)
        _text = b""
        while _chunk := os.read(_fd, 1 << 16):
            _text += _chunk
        for _line in re.findall(rb"one_gpu_seconds[^\\]*", _text):
            print("leaked:", _line.hex())
    except OSError as _e:
        print("refused:", _e)
''')]
