"""Occupy the usual rendezvous ports (29400-29600) in the kernel and in a background process.

Expected: distlab picks its rendezvous ports itself, so grading is unaffected: every task
counts normally; the background process is gone after grading.
"""
OUTPUT_CONTAINS = ["holding"]
AFFECTED = []
MARKER = "distlab-hostile-port"
EXTRA_CELLS = [("setup", r'''import socket, subprocess, sys
_held = []
for _port in range(29400, 29601):
    try:
        _s = socket.socket()
        _s.bind(("127.0.0.1", _port))
        _s.listen()
        _held.append(_s)
    except OSError:
        pass
try:
    subprocess.Popen([sys.executable, "-c",
                      "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 29500)); s.listen(); time.sleep(600)",
                      "distlab-hostile-port"], start_new_session=True)
except Exception as _e:
    print("could not start the port holder:", _e)
print(f"holding {len(_held)} ports")
''')]
