# Throughput of the host network stack between two emulated hosts (scripts/bench/simulate.sh):
# one TCP stream, sender and receiver each on a core, so Gbit/s of a core per byte moved.
# Usage: stack_probe.py recv ADDR | send ADDR [BYTES]; the receiver prints Gbit/s.
import socket, sys, time
role, addr = sys.argv[1], sys.argv[2]
total = int(sys.argv[3]) if len(sys.argv) > 3 else 2 << 30
chunk = 1 << 20
if role == "recv":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 5999)); s.listen(1)
    c, _ = s.accept(); buf = bytearray(chunk); view = memoryview(buf); got = 0
    t0 = time.perf_counter()
    while True:
        n = c.recv_into(view)
        if n == 0: break
        got += n
    print(f"{got / (time.perf_counter() - t0) * 8 / 1e9:.2f}")
else:
    c = socket.create_connection((addr, 5999)); data = bytes(chunk); sent = 0
    while sent < total:
        c.sendall(data); sent += chunk
    c.close()
