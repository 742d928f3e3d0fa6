"""Record header names: the one table (SPEC.md, "Log records"). Values are always decimal or hex strings.

Every record a hilo-sync writer appends carries the chunk headers; update and checkpoint records add the
position headers a reader of the topic's tail (`hilo lag`, bootstrap) needs without decoding the body.
"""

# On every chunk (schemas/chunks.py)
RUN = "hilo-run"                        # run id; a record of another run is foreign
KIND = "hilo-kind"                      # update | checkpoint | key
VERSION = "hilo-version"                # policy version of the message
CHUNK = "hilo-chunk"                    # "i/n": chunk i of n
SIZE = "hilo-size"                      # bytes of the whole message
SUM = "hilo-sum"                        # xxh3-64 hex of the whole message

# Position headers on update and checkpoint records
DIGEST = "hilo-digest"                  # state digest after the version (hex)
LOG_BYTES = "hilo-log-bytes"            # cumulative update bytes through the version
UPDATES_OFFSET = "hilo-updates-offset"  # checkpoint: the RUN.updates offset its replay starts at
GENESIS = "hilo-genesis"                # checkpoint: digest of the run's genesis state (which history)
LAG = "hilo-lag"                        # delta mode: the sites' relative lag behind the trainer's master

# On prompt and rollout records (the return path)
PROMPT = "hilo-prompt"                  # prompt id
SITE = "hilo-site"                      # rollout: the site that generated it
LEASE = "hilo-lease"                    # rollout on the embedded log: the lease it settles (its prompts are then answered)

CHUNK_HEADERS = (RUN, KIND, VERSION, CHUNK, SIZE, SUM)
ALL = CHUNK_HEADERS + (DIGEST, LOG_BYTES, UPDATES_OFFSET, GENESIS, LAG, PROMPT, SITE, LEASE)
