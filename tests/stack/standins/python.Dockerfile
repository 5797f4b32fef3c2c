# Stand-in for python:3.11-slim-bookworm, for machines with no registry (make test-stack builds it only
# when that tag is missing and cannot be pulled). Debian bookworm's own Python 3.11 with pip, from the
# locally bootstrapped base (tests/stack/engine.py), laid out as the official image is where it matters:
# `python` and `pip` on the PATH, installing into the system site.
FROM shardline-stack-base:bookworm
RUN ln -sf /usr/bin/python3 /usr/local/bin/python \
    && ln -sf /usr/bin/pip3 /usr/local/bin/pip \
    && rm -f /usr/lib/python3.11/EXTERNALLY-MANAGED
ENV LANG=C.UTF-8
CMD ["python3"]
