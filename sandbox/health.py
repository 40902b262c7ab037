"""The sandbox service's health check for containers: exit 0 iff `GET <url>` answers 200 within 5 seconds.

    python -m sandbox.health http://127.0.0.1:8080/info

`/info` answers once the service's warm-up (fork server, warm sandboxes, the isolation self-test) is done, and is
refused (500) when that check failed, so a sandbox that cannot isolate is unhealthy; `GET /` answers as soon as the
server takes requests.

compose.yaml runs it (no argument holds a space: Podman 4.3's Docker API re-splits a health check's arguments on
spaces, which breaks `python -c "<code>"`).
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    url = argv[0] if argv else "http://127.0.0.1:8080/info"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return 0 if answer.status == 200 else 1
    except (OSError, urllib.error.URLError) as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
