#!/usr/bin/env bash
# hfd.sh: download a Hugging Face hub repo with aria2c (or wget): resumable, parallel,
# every file checked against the hub's hashes, hostile file names refused, token kept
# out of `ps`, logs and the download folder. Run with --help for usage.
set -euo pipefail
export LC_ALL=C

PROG=hfd.sh
usage() {
  cat <<'EOF'
Usage: hfd.sh REPO_ID [options]

Download the files of a Hugging Face hub repo (model or dataset) into a local folder.
Re-running the same command resumes an interrupted download; files already verified
are not fetched again. Every file is checked against the hub's sha256 (LFS files) or
git hash (small files); a file that does not match is fetched again.

Options:
  --include PAT...     only files whose path matches one of these globs ('*' also matches '/'),
                       e.g. --include 'data/train-0000*'
  --exclude PAT...     skip files whose path matches one of these globs
  --dataset            REPO_ID is a dataset (default: a model)
  --local-dir DIR      where to put the files (default: ./NAME for REPO_ID ORG/NAME)
  --revision REV       branch, tag or commit to download (default: main)
  --tool aria2c|wget   downloader (default aria2c; falls back to wget if aria2c is missing)
  -x N                 aria2c: connections per file, 1-16 (default 4)
  -j N                 aria2c: files downloaded at once (default 5); wget fetches one at a time
  --hf_token TOKEN     token for gated/private repos; prefer `export HF_TOKEN=...` because a
                       command-line token is visible to other users in `ps`
  --hf_username USER   accepted for compatibility; not needed (the token is enough)
  --list-only          print the selected files and exit, nothing downloaded: a line
                       'commit SHA', then one 'SIZE<TAB>KIND<TAB>HASH<TAB>NAME' line per file
  --verify-only        re-hash the files already in --local-dir against the listing saved by
                       the last download; uses no network; exit 1 if anything is missing or wrong
  -h, --help           show this help

Environment: HF_ENDPOINT (default https://huggingface.co) selects the hub or a mirror;
HF_TOKEN (or the token saved by `hf auth login`) authenticates; HFD_RETRY_WAIT sets the seconds
before a failed request is retried (default 2).
Needs curl and jq, plus aria2c or wget.
Exit status: 0 when every selected file is present and verified, 1 otherwise.
EOF
}

say() { printf '%s\n' "$*"; }
warn() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
usage_error() {
  printf '%s: error: %s\n' "$PROG" "$1" >&2
  usage >&2
  exit 1
}

# ---------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------
REPO_ID=""
INCLUDES=()
EXCLUDES=()
TOKEN_ARG=""
TOOL="aria2c"
THREADS=4
JOBS=5
REPO_TYPE="model"
LOCAL_DIR=""
REVISION="main"
VERIFY_ONLY=0
LIST_ONLY=0

need_value() { (($# >= 2)) && [[ -n $2 && $2 != -* ]] || usage_error "$1 needs a value"; }

while (($#)); do
  arg=$1
  if [[ $arg == --*=* ]]; then # --opt=value form
    shift
    set -- "${arg%%=*}" "${arg#*=}" "$@"
    arg=$1
  fi
  case $arg in
    -h | --help) usage; exit 0 ;;
    --include | --exclude)
      shift
      (($#)) && [[ $1 != -* ]] || usage_error "$arg needs at least one pattern"
      while (($#)) && [[ $1 != -* ]]; do
        if [[ $arg == --include ]]; then INCLUDES+=("$1"); else EXCLUDES+=("$1"); fi
        shift
      done
      continue
      ;;
    --hf_username) need_value "$@"; shift ;;
    --hf_token) need_value "$@"; TOKEN_ARG=$2; shift ;;
    --tool) need_value "$@"; TOOL=$2; shift ;;
    -x) need_value "$@"; THREADS=$2; shift ;;
    -j) need_value "$@"; JOBS=$2; shift ;;
    --dataset) REPO_TYPE="dataset" ;;
    --local-dir) need_value "$@"; LOCAL_DIR=$2; shift ;;
    --revision) need_value "$@"; REVISION=$2; shift ;;
    --verify-only) VERIFY_ONLY=1 ;;
    --list-only) LIST_ONLY=1 ;;
    -*) usage_error "unknown option '$arg'" ;;
    *)
      [[ -z $REPO_ID ]] || usage_error "unexpected argument '$arg' (REPO_ID is already '$REPO_ID')"
      REPO_ID=$arg
      ;;
  esac
  shift
done

[[ -n $REPO_ID ]] || usage_error "missing REPO_ID (e.g. Kaichengalex/YFCC15M --dataset)"
[[ $REPO_ID =~ ^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$ && $REPO_ID != *..* ]] \
  || usage_error "REPO_ID '$REPO_ID' is not a repo id; use ORG/NAME, e.g. Kaichengalex/YFCC15M"
[[ $TOOL == aria2c || $TOOL == wget ]] || usage_error "--tool must be aria2c or wget, not '$TOOL'"
[[ $THREADS =~ ^[0-9]+$ ]] && ((THREADS >= 1 && THREADS <= 16)) || usage_error "-x must be a number from 1 to 16, not '$THREADS'"
[[ $JOBS =~ ^[0-9]+$ ]] && ((JOBS >= 1 && JOBS <= 64)) || usage_error "-j must be a number from 1 to 64, not '$JOBS'"
[[ -n $REVISION && $REVISION != *[[:space:][:cntrl:]]* ]] || usage_error "--revision '$REVISION' is not a valid revision"
[[ -n $LOCAL_DIR ]] || LOCAL_DIR=${REPO_ID##*/}

ENDPOINT=${HF_ENDPOINT:-https://huggingface.co}
ENDPOINT=${ENDPOINT%/}
# What messages and files name: the endpoint without the user info (user:password@) a mirror behind
# basic auth takes, which, like the token, is never shown or stored.
without_userinfo() { sed -E 's|^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#[:space:]]*@|\1|' <<<"$1"; }
SHOWN_ENDPOINT=$(without_userinfo "$ENDPOINT")
[[ $ENDPOINT =~ ^https?://[^/[:space:]]+(/[^[:space:]]*)?$ ]] || die "HF_ENDPOINT '$SHOWN_ENDPOINT' is not an http(s) URL; unset it to use https://huggingface.co"
MAX_ROUNDS=${HFD_MAX_ROUNDS:-3}
BATCH=${HFD_BATCH:-64}
# Seconds the downloader waits before retrying a failed request (wget backs off up to it).
RETRY_WAIT=${HFD_RETRY_WAIT:-2}
[[ $RETRY_WAIT =~ ^[0-9]+$ ]] && ((RETRY_WAIT >= 1 && RETRY_WAIT <= 600)) \
  || die "HFD_RETRY_WAIT '$RETRY_WAIT' is not a number of seconds from 1 to 600; unset it for the default 2"
NPROC=$(nproc 2>/dev/null || echo 2)

# ---------------------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------------------
install_hint() { say "install it with: sudo apt-get install $1 (Debian/Ubuntu), sudo dnf install $1 (Fedora/RHEL) or brew install $1 (macOS)"; }
require() {
  command -v "$1" >/dev/null 2>&1 || die "$1 is required but not installed; $(install_hint "$2")"
}
require sha256sum coreutils
require sha1sum coreutils
if ((!VERIFY_ONLY)); then
  require curl curl
  require jq jq
  if [[ $TOOL == aria2c ]] && ! command -v aria2c >/dev/null 2>&1; then
    if command -v wget >/dev/null 2>&1; then
      warn "aria2c not found, falling back to wget (one file at a time). For parallel downloads $(install_hint aria2)"
      TOOL=wget
    else
      die "neither aria2c nor wget is installed; $(install_hint aria2)"
    fi
  fi
  [[ $TOOL != wget ]] || require wget wget
fi

# ---------------------------------------------------------------------------------------
# Private scratch space (0700, outside the download folder) and clean-up
# ---------------------------------------------------------------------------------------
SCRATCH_ROOT=${TMPDIR:-/tmp}
# A run killed with SIGKILL runs no trap; its watchdog (below) cleans up, unless it was killed
# too (the whole process group). Then the next run removes the folder: ours (owned by us, with
# an owner file) and its owner gone. A folder whose owner still runs is another download's.
for old in "$SCRATCH_ROOT"/hfd.*; do
  [[ -d $old && -O $old && -f $old/owner ]] || continue
  owner=$(head -c 32 -- "$old/owner" 2>/dev/null || true)
  if [[ $owner =~ ^[0-9]+$ ]] && ! kill -0 "$owner" 2>/dev/null; then rm -rf -- "$old"; fi
done
PRIV=$(umask 077 && mktemp -d "$SCRATCH_ROOT/hfd.XXXXXXXX") || die "cannot create a temporary folder in $SCRATCH_ROOT"
printf '%s\n' "$$" >"$PRIV/owner"
CHILD=""
WATCHDOG=""
cleanup() {
  if [[ -n $WATCHDOG ]]; then kill "$WATCHDOG" 2>/dev/null || true; fi
  rm -rf -- "$PRIV"
}
on_signal() {
  if [[ -n $CHILD ]]; then
    kill -TERM "$CHILD" 2>/dev/null || true
    wait "$CHILD" 2>/dev/null || true
  fi
  warn "interrupted; run the same command again to resume"
  exit 130
}
trap cleanup EXIT
trap on_signal INT TERM HUP

# The watchdog: a kill -9 of this script (the OOM killer, a scheduler) would leave aria2c or
# wget downloading and the token in PRIV. Once this script is gone it stops the downloader
# (SIGTERM: aria2c saves its resume state) and deletes PRIV. Stopped by cleanup on a normal exit.
watchdog() {
  trap - EXIT INT TERM HUP
  local parent=$1 child
  while kill -0 "$parent" 2>/dev/null; do sleep 1; done
  child=$(cat -- "$PRIV/child" 2>/dev/null || true)
  if [[ $child =~ ^[0-9]+$ ]]; then kill -TERM "$child" 2>/dev/null || true; fi
  rm -rf -- "$PRIV"
}
# Started from a subshell that exits at once, so it is not this shell's child: no `wait` of this
# shell (a trap's, bash's own) can block on it, which lives as long as this shell does.
(watchdog "$$" </dev/null >/dev/null 2>&1 & printf '%s\n' "$!" >"$PRIV/watchdog")
WATCHDOG=$(cat -- "$PRIV/watchdog")

# A child in the background + wait, so that a signal to this script reaches the
# downloader too (and it can save its resume state) instead of orphaning it.
run_child() {
  "$@" &
  CHILD=$!
  printf '%s\n' "$CHILD" >"$PRIV/child" # for the watchdog
  local rc=0
  wait "$CHILD" || rc=$?
  CHILD=""
  rm -f -- "$PRIV/child"
  return "$rc"
}

# The downloaders' own lines name the URLs they fetch: where the endpoint carries user info, they are
# shown without it (sed -u: a line as soon as it is written).
redact_urls() { sed -u -E 's|([A-Za-z][A-Za-z0-9+.-]*://)[^/?#[:space:]]*@|\1|g'; }
run_downloader() {
  if [[ $ENDPOINT == "$SHOWN_ENDPOINT" ]]; then
    run_child "$@"
  else
    run_child "$@" > >(redact_urls) 2> >(redact_urls >&2)
  fi
}

# Called once the listing worked (so a typo in REPO_ID leaves no empty folder behind).
setup_local_dir() {
  if ((VERIFY_ONLY)); then
    [[ -d $LOCAL_DIR ]] || die "--local-dir '$LOCAL_DIR' does not exist; give the folder of a finished download"
  else
    mkdir -p -- "$LOCAL_DIR" 2>/dev/null || die "cannot create --local-dir '$LOCAL_DIR'; check the path and permissions"
  fi
  LOCAL_DIR=$(cd -- "$LOCAL_DIR" && pwd -P)
  case $PRIV/ in "$LOCAL_DIR"/*) die "TMPDIR is inside --local-dir; set TMPDIR to another folder" ;; esac
  STATE_DIR=$LOCAL_DIR/.hfd
  STAGING=$STATE_DIR/incomplete
  STATE=$STATE_DIR/verified.tsv    # name size mtime kind hash: files verified at that size+mtime
  MANIFEST=$STATE_DIR/manifest.tsv # flag size kind hash urlpath name: the last listing
  ((VERIFY_ONLY)) || mkdir -p -- "$STAGING"
}

# ---------------------------------------------------------------------------------------
# Token: --hf_token, else HF_TOKEN, else the token file of `hf auth login`
# ---------------------------------------------------------------------------------------
TOKEN=""
if ((!VERIFY_ONLY)); then
  if [[ -n $TOKEN_ARG ]]; then
    warn "note: --hf_token is visible to other users in 'ps' and stays in your shell history; prefer 'export HF_TOKEN=...'"
    TOKEN=$TOKEN_ARG
  elif [[ -n ${HF_TOKEN:-} ]]; then
    TOKEN=$HF_TOKEN
  else
    token_file=${HF_TOKEN_PATH:-${HF_HOME:-${HOME:-/nonexistent}/.cache/huggingface}/token}
    if [[ -r $token_file ]]; then TOKEN=$(tr -d '[:space:]' <"$token_file"); fi
  fi
  [[ $TOKEN != *[[:space:][:cntrl:]]* ]] || die "the token contains spaces or control characters; check HF_TOKEN"
  unset HF_TOKEN TOKEN_ARG
  if [[ -n $TOKEN ]]; then
    # printf is a builtin: the token never appears on a command line
    printf 'Authorization: Bearer %s\n' "$TOKEN" >"$PRIV/curl_auth"
    printf 'header = Authorization: Bearer %s\n' "$TOKEN" >"$PRIV/wgetrc_auth"
  fi
fi

# ---------------------------------------------------------------------------------------
# Hub API
# ---------------------------------------------------------------------------------------
KIND_WORD=$([[ $REPO_TYPE == dataset ]] && echo dataset || echo model)
API=$ENDPOINT/api/${REPO_TYPE}s/$REPO_ID
if [[ $REPO_TYPE == dataset ]]; then RESOLVE_BASE=$ENDPOINT/datasets/$REPO_ID/resolve; else RESOLVE_BASE=$ENDPOINT/$REPO_ID/resolve; fi
ENDPOINT_ORIGIN=$(sed -E 's#^(https?://[^/]+).*#\1#' <<<"$ENDPOINT")
SHOWN_ORIGIN=$(sed -E 's#^(https?://[^/]+).*#\1#' <<<"$SHOWN_ENDPOINT") # as the hub's own links name it
uri_encode() { jq -rn --arg s "$1" '$s|@uri'; }

curl_auth_args() { if [[ -n $TOKEN ]]; then printf '%s\n' -H "@$PRIV/curl_auth"; fi; }
# A URL reaches curl and wget through a pipe (curl's -K config, wget's -i list), never as an
# argument: an HF_ENDPOINT with user:password@ would stand in `ps` for every user of the machine.
curl_url_config() { local u=${1//\\/\\\\}; printf 'url = "%s"\n' "${u//\"/\\\"}"; }

# api_get URL OUT HEADERS: prints the HTTP status; the hub's transient errors are retried.
api_get() {
  local auth=()
  mapfile -t auth < <(curl_auth_args)
  curl -sS --retry 6 --retry-delay 1 --retry-connrefused --connect-timeout 30 --max-time 300 \
    "${auth[@]}" -o "$2" -D "$3" -w '%{http_code}' -K <(curl_url_config "$1") \
    || die "cannot reach $SHOWN_ENDPOINT (curl failed on $(without_userinfo "$1")); check your network or HF_ENDPOINT"
}

# explain_status CODE HEADERS WHAT: dies with a message a user can act on
explain_status() {
  local code=$1 hdrs=$2 what=$3 err
  err=$(grep -i '^x-error-code:' "$hdrs" 2>/dev/null | tail -n1 | tr -d '\r' | sed 's/^[^:]*:[[:space:]]*//' || true)
  case $code in
    401 | 403)
      if [[ -n $TOKEN ]]; then
        die "the hub refused the token ($code) for $KIND_WORD '$REPO_ID': check that it is valid and that you accepted the repo's terms on $SHOWN_ENDPOINT/$([[ $REPO_TYPE == dataset ]] && echo datasets/)$REPO_ID"
      fi
      die "the hub answered $code for $KIND_WORD '$REPO_ID': it is gated or private (or does not exist). Accept its terms on the hub, create a token at $SHOWN_ENDPOINT/settings/tokens and run: export HF_TOKEN=hf_... (or pass --hf_token)"
      ;;
    404)
      if [[ $err == RevisionNotFound ]]; then die "revision '$REVISION' not found in $KIND_WORD '$REPO_ID' at $SHOWN_ENDPOINT; check --revision"; fi
      if [[ $err == EntryNotFound ]]; then die "$what not found in $KIND_WORD '$REPO_ID' at revision '$REVISION'"; fi
      die "$KIND_WORD '$REPO_ID' (revision '$REVISION') not found at $SHOWN_ENDPOINT; check the name$([[ $REPO_TYPE == model ]] && echo ', add --dataset for a dataset repo')"
      ;;
    429) die "the hub is rate-limiting requests (429) for $what; wait a few minutes and run again (a token raises the limit)" ;;
    5??) die "the hub answered $code for $what after several retries; try again later" ;;
    *) die "unexpected HTTP status $code for $what" ;;
  esac
}

# Each listed file becomes one TSV line: flag size kind hash urlpath name.
# flag is ok, bad (a name that could escape the folder or a malformed entry) or ctl (a name
# with control characters, shown JSON-quoted); only "ok" entries are ever downloaded.
JQ_ENTRIES='
  .[] | select(.type == "file") | .path as $p
  | (if .lfs then "sha256" else "gitsha1" end) as $kind
  | (if .lfs then .lfs.oid else .oid end) as $hash
  | (if ($p | type) != "string" or ($p | test("[[:cntrl:]]")) then "ctl"
     elif ($p | test("^/|\\\\|(^|/)\\.\\.?(/|$)|//|/$|^$|^[A-Za-z]:|^\\.hfd(/|$)")) then "bad"
     elif (.size | type) != "number" or ($hash | type) != "string" then "bad"
     elif $kind == "sha256" and ($hash | test("^[0-9a-f]{64}$") | not) then "bad"
     elif $kind == "gitsha1" and ($hash | test("^[0-9a-f]{40}$") | not) then "bad"
     else "ok" end) as $flag
  | [$flag, (.size | tostring), $kind, ($hash | tostring),
     (if $flag == "ok" then ($p | split("/") | map(@uri) | join("/")) else "-" end),
     (if $flag == "ctl" then ($p | tojson) else $p end)]
  | join("\t")'

# The repo info's `siblings` (asked with ?blobs=true) in the tree API's entry shape, for
# hubs and mirrors that do not serve the tree API.
JQ_SIBLINGS_AS_TREE='
  [.siblings[]? | {type: "file", path: .rfilename, size: (.lfs.size // .size), oid: .blobId,
                   lfs: (if .lfs then {oid: .lfs.sha256, size: .lfs.size} else null end)}]'

list_repo() {
  local code url next page=0
  code=$(api_get "$API/revision/$(uri_encode "$REVISION")?blobs=true" "$PRIV/info.json" "$PRIV/info.h")
  [[ $code == 200 ]] || explain_status "$code" "$PRIV/info.h" "the repo listing"
  COMMIT=$(jq -r '.sha // empty' "$PRIV/info.json" 2>/dev/null) || die "the hub's answer for $REPO_ID is not JSON; is HF_ENDPOINT ($SHOWN_ENDPOINT) a hub?"
  # the paginated tree at the pinned commit: consistent even if the branch moves meanwhile
  # a mirror that names no commit is read (and downloaded from) at the revision itself
  [[ $COMMIT =~ ^[0-9a-f]{40}$ ]] || COMMIT=$(uri_encode "$REVISION")
  url="$API/tree/$COMMIT?recursive=true"
  : >"$PRIV/entries.tsv"
  while [[ -n $url ]]; do
    page=$((page + 1))
    code=$(api_get "$url" "$PRIV/page.json" "$PRIV/page.h")
    if [[ $page == 1 && $code =~ ^(400|404|405|501)$ ]] && jq -e '.siblings | length > 0' "$PRIV/info.json" >/dev/null 2>&1; then
      # no tree API here: the siblings of the info answer carry the same names, sizes and hashes
      warn "the hub at $SHOWN_ENDPOINT has no tree listing ($code); using the repo info's file list"
      jq "$JQ_SIBLINGS_AS_TREE" "$PRIV/info.json" >"$PRIV/page.json" \
        && jq -r "$JQ_ENTRIES" "$PRIV/page.json" >>"$PRIV/entries.tsv" 2>/dev/null \
        || die "the hub's repo info for $REPO_ID lists files in an unknown form; is HF_ENDPOINT ($SHOWN_ENDPOINT) a hub?"
      return 0
    fi
    [[ $code == 200 ]] || explain_status "$code" "$PRIV/page.h" "the file listing"
    jq -r "$JQ_ENTRIES" "$PRIV/page.json" >>"$PRIV/entries.tsv" 2>/dev/null \
      || die "the hub's file listing (page $page) is not what a hub sends; is HF_ENDPOINT ($SHOWN_ENDPOINT) a hub?"
    next=$(grep -i '^link:' "$PRIV/page.h" | tr -d '\r' | grep -o '<[^>]*>[^,]*rel="next"' | sed -E 's/^<([^>]*)>.*/\1/' | head -n1 || true)
    # never follow (and send the token to) a next-page link that leaves the hub
    if [[ -n $next && $next != "$SHOWN_ORIGIN"/* ]]; then die "the listing's next-page link leaves $SHOWN_ENDPOINT; refusing it"; fi
    [[ -z $next ]] || next=$ENDPOINT_ORIGIN${next#"$SHOWN_ORIGIN"} # with the endpoint's user info, if any
    url=$next
  done
}

# ---------------------------------------------------------------------------------------
# Selection, state, hashing
# ---------------------------------------------------------------------------------------
matches_any() {
  local name=$1 pat
  shift
  for pat in "$@"; do
    # shellcheck disable=SC2053  # unquoted on purpose: a glob
    [[ $name == $pat ]] && return 0
  done
  return 1
}

NAMES=() SIZES=() KINDS=() HASHES=() URLS=()
N_REFUSED=0
select_entries() { # reads entries TSV on stdin
  local flag size kind hash urlpath name
  while IFS=$'\t' read -r flag size kind hash urlpath name; do
    if ((${#INCLUDES[@]})) && ! matches_any "$name" "${INCLUDES[@]}"; then continue; fi
    if ((${#EXCLUDES[@]})) && matches_any "$name" "${EXCLUDES[@]}"; then continue; fi
    if [[ $flag != ok ]]; then
      warn "error: refusing unsafe file name $(jq -rn --arg s "$name" '$s|tojson') from the listing (it could be written outside $LOCAL_DIR)"
      N_REFUSED=$((N_REFUSED + 1))
      continue
    fi
    NAMES+=("$name") SIZES+=("$size") KINDS+=("$kind") HASHES+=("$hash") URLS+=("$urlpath")
  done
}

declare -A VERIFIED=()
load_state() {
  local name rest
  [[ -f $STATE ]] || return 0
  while IFS=$'\t' read -r name rest; do [[ -n $name ]] && VERIFIED[$name]=$rest; done <"$STATE"
}
save_state() {
  local name
  for name in "${!VERIFIED[@]}"; do printf '%s\t%s\n' "$name" "${VERIFIED[$name]}"; done | sort >"$STATE.tmp"
  mv -f -- "$STATE.tmp" "$STATE"
}
stat_size_mtime() { stat -c '%s	%.9Y' -- "$1"; }

# is_verified I: the file is in place with the size and mtime it had when it was verified
is_verified() {
  local i=$1 f=$LOCAL_DIR/${NAMES[$1]}
  [[ -f $f && ! -L $f ]] || return 1
  [[ ${VERIFIED[${NAMES[$i]}]:-} == "$(stat_size_mtime "$f")	${KINDS[$i]}	${HASHES[$i]}" ]]
}

# hash_file PATH KIND SIZE: sha256 for LFS files, git blob sha1 for the others
hash_file() {
  if [[ $2 == sha256 ]]; then
    sha256sum <"$1" | cut -d' ' -f1
  else
    { printf 'blob %d\0' "$3"; cat -- "$1"; } | sha1sum | cut -d' ' -f1
  fi
}

# check_files DIR I...: hashes DIR/NAME for each index in parallel; prints "I ok", "I bad"
# (wrong hash or too big) or "I short" (missing or smaller: maybe a download to resume)
check_files() {
  local dir=$1 i running=0
  shift
  for i in "$@"; do
    (
      f=$dir/${NAMES[$i]} size=-1
      [[ -f $f ]] && size=$(stat -c %s -- "$f")
      if ((size < SIZES[i])); then
        echo "$i short"
      elif ((size == SIZES[i])) && [[ $(hash_file "$f" "${KINDS[$i]}" "${SIZES[$i]}") == "${HASHES[$i]}" ]]; then
        echo "$i ok"
      else
        echo "$i bad"
      fi
    ) &
    running=$((running + 1))
    if ((running >= NPROC)); then
      wait -n || true
      running=$((running - 1))
    fi
  done
  wait || true
}

record_verified() { # I: remember the final file as verified
  VERIFIED[${NAMES[$1]}]="$(stat_size_mtime "$LOCAL_DIR/${NAMES[$1]}")	${KINDS[$1]}	${HASHES[$1]}"
}

# safe_dest I: the final path, after checking (symlinks included) that it stays in LOCAL_DIR
safe_dest() {
  local name=${NAMES[$1]} parent
  parent=$(dirname -- "$LOCAL_DIR/$name")
  mkdir -p -- "$parent"
  parent=$(cd -- "$parent" && pwd -P)
  case $parent/ in
    "$LOCAL_DIR"/*) printf '%s/%s' "$parent" "$(basename -- "$name")" ;;
    *) return 1 ;;
  esac
}

human() { awk -v b="$1" 'BEGIN { split("B KB MB GB TB PB", u); i = 1; while (b >= 1000 && i < 6) { b /= 1000; i++ } printf (i == 1 ? "%d %s" : "%.1f %s"), b, u[i] }'; }

# ---------------------------------------------------------------------------------------
# --verify-only: no network, the listing saved by the last download
# ---------------------------------------------------------------------------------------
if ((VERIFY_ONLY)); then
  setup_local_dir
  [[ -s $MANIFEST ]] || die "no saved listing in $LOCAL_DIR (looked for .hfd/manifest.tsv); run the download once without --verify-only"
  select_entries <"$MANIFEST"
  load_state
  ((${#NAMES[@]})) || die "no file of the saved listing matches --include/--exclude"
  say "Verifying ${#NAMES[@]} files in $LOCAL_DIR against $(head -n1 "$STATE_DIR/source" 2>/dev/null || echo 'the saved listing')"
  n_ok=0 n_missing=0 n_bad=0
  idx=()
  for i in "${!NAMES[@]}"; do
    if [[ -f $LOCAL_DIR/${NAMES[$i]} ]]; then idx+=("$i"); else
      warn "missing: ${NAMES[$i]}"
      n_missing=$((n_missing + 1))
      unset "VERIFIED[${NAMES[$i]}]"
    fi
  done
  if ((${#idx[@]})); then
    while read -r i res; do
      if [[ $res == ok ]]; then
        n_ok=$((n_ok + 1))
        record_verified "$i"
      else
        warn "checksum mismatch: ${NAMES[$i]}"
        n_bad=$((n_bad + 1))
        unset "VERIFIED[${NAMES[$i]}]"
      fi
    done < <(check_files "$LOCAL_DIR" "${idx[@]}")
  fi
  save_state
  say "Summary: ${#NAMES[@]} files checked: $n_ok ok, $n_missing missing, $n_bad corrupt."
  if ((n_missing + n_bad)); then
    say "Run the download again (without --verify-only) to fetch the missing or corrupt files."
    exit 1
  fi
  exit 0
fi

# ---------------------------------------------------------------------------------------
# Download
# ---------------------------------------------------------------------------------------
if ((LIST_ONLY)); then
  # For a caller that downloads file by file (data2rec.py --from-hub): the listing only, at
  # a pinned commit, with no folder created.
  say "Listing $KIND_WORD $REPO_ID@$REVISION at $SHOWN_ENDPOINT ..." >&2
  list_repo
  select_entries <"$PRIV/entries.tsv"
  ((${#NAMES[@]})) || die "no file of $REPO_ID matches --include/--exclude"
  printf 'commit\t%s\n' "$COMMIT"
  for i in "${!NAMES[@]}"; do printf '%s\t%s\t%s\t%s\n' "${SIZES[$i]}" "${KINDS[$i]}" "${HASHES[$i]}" "${NAMES[$i]}"; done
  exit 0
fi
say "Listing $KIND_WORD $REPO_ID@$REVISION at $SHOWN_ENDPOINT ..."
list_repo
setup_local_dir
awk -F'\t' '$1 == "ok"' "$PRIV/entries.tsv" >"$MANIFEST.tmp" && mv -f -- "$MANIFEST.tmp" "$MANIFEST"
printf '%s %s@%s (commit %s) from %s\n' "$KIND_WORD" "$REPO_ID" "$REVISION" "$COMMIT" "$SHOWN_ENDPOINT" >"$STATE_DIR/source"
select_entries <"$PRIV/entries.tsv"
load_state
if ((${#NAMES[@]} == 0)); then
  ((N_REFUSED == 0)) || die "all $N_REFUSED selected files were refused (unsafe names)"
  die "no file of $REPO_ID matches --include/--exclude"
fi

# Files already here: trust the verified state; hash files that are here without it.
n_present=0 n_fetched=0
pending=() unknown=()
for i in "${!NAMES[@]}"; do
  if is_verified "$i"; then n_present=$((n_present + 1))
  elif [[ -f $LOCAL_DIR/${NAMES[$i]} ]]; then unknown+=("$i")
  else pending+=("$i"); fi
done
if ((${#unknown[@]})); then
  say "Checking ${#unknown[@]} files already in $LOCAL_DIR ..."
  while read -r i res; do
    if [[ $res == ok ]]; then
      record_verified "$i"
      n_present=$((n_present + 1))
    else
      warn "${NAMES[$i]} does not match the hub's hash; fetching it again"
      rm -f -- "$LOCAL_DIR/${NAMES[$i]}"
      pending+=("$i")
    fi
  done < <(check_files "$LOCAL_DIR" "${unknown[@]}")
  save_state
fi

total=0 todo=0
for i in "${!NAMES[@]}"; do total=$((total + SIZES[i])); done
for i in "${pending[@]}"; do todo=$((todo + SIZES[i])); done
say "Selected ${#NAMES[@]} files ($(human "$total")); $n_present already verified; ${#pending[@]} to fetch ($(human "$todo"))."
if ((todo > 0)) && [[ ${HFD_SKIP_SPACE_CHECK:-0} != 1 ]]; then
  partial=$(du -sB1 -- "$STAGING" 2>/dev/null | cut -f1 || echo 0)
  avail=$(df -PB1 -- "$LOCAL_DIR" | awk 'NR == 2 { print $4 }')
  if [[ $avail =~ ^[0-9]+$ ]] && ((todo - partial > avail)); then
    die "needs $(human $((todo - partial))) but only $(human "$avail") is free in $LOCAL_DIR; free space or select fewer files with --include (set HFD_SKIP_SPACE_CHECK=1 to skip this check)"
  fi
fi

# resolve I: the URL to give the downloader, and whether it may carry the token.
# With a token, LFS redirects are resolved here so that the token goes to the hub only,
# never to the storage host the hub redirects to.
resolve() {
  local i=$1 url="$RESOLVE_BASE/$COMMIT/${URLS[$1]}" out code target auth=()
  if [[ -z $TOKEN ]]; then
    printf '%s\tnoauth\n' "$url"
    return 0
  fi
  mapfile -t auth < <(curl_auth_args)
  out=$(curl -sS -I --retry 6 --retry-delay 1 --retry-connrefused --connect-timeout 30 --max-time 120 \
    "${auth[@]}" -o /dev/null -w '%{http_code}\t%{redirect_url}' -K <(curl_url_config "$url")) || return 1
  code=${out%%$'\t'*} target=${out#*$'\t'}
  case $code in
    200) printf '%s\tauth\n' "$url" ;;
    30[1278])
      if [[ $target == "$SHOWN_ORIGIN"/* ]]; then printf '%s\tauth\n' "$url"; else printf '%s\tnoauth\n' "$target"; fi
      ;;
    401 | 403) explain_status "$code" /dev/null "${NAMES[$i]}" ;;
    *) warn "the hub answered $code for ${NAMES[$i]}"; return 1 ;;
  esac
}

download_batch() { # I...: fetch into STAGING
  local i url mode
  if [[ $TOOL == aria2c ]]; then
    : >"$PRIV/aria2.in"
    for i in "$@"; do
      IFS=$'\t' read -r url mode < <(resolve "$i") || continue
      {
        printf '%s\n  dir=%s\n  out=%s\n' "$url" "$STAGING" "${NAMES[$i]}"
        if [[ $mode == auth ]]; then printf '  header=Authorization: Bearer %s\n' "$TOKEN"; fi
      } >>"$PRIV/aria2.in"
    done
    [[ -s $PRIV/aria2.in ]] || return 0
    say "Fetching $# files with aria2c ($THREADS connections per file, $JOBS files at once) ..."
    run_downloader aria2c --no-conf=true --input-file="$PRIV/aria2.in" \
      --max-connection-per-server="$THREADS" --split="$THREADS" --min-split-size=1M \
      --max-concurrent-downloads="$JOBS" --continue=true --auto-file-renaming=false \
      --max-tries=10 --retry-wait="$RETRY_WAIT" --connect-timeout=30 --timeout=60 \
      --auto-save-interval=5 --file-allocation=none --console-log-level=error \
      --summary-interval=0 --download-result=hide --human-readable=true || true
  else
    local progress=(-nv) k=0
    [[ -t 2 ]] && progress=(-q --show-progress)
    for i in "$@"; do
      IFS=$'\t' read -r url mode < <(resolve "$i") || continue
      local conf=(--no-config)
      [[ $mode == auth ]] && conf=(--config="$PRIV/wgetrc_auth")
      k=$((k + 1))
      say "[$k/$#] ${NAMES[$i]}"
      mkdir -p -- "$(dirname -- "$STAGING/${NAMES[$i]}")"
      run_downloader wget "${conf[@]}" "${progress[@]}" -c -O "$STAGING/${NAMES[$i]}" --tries=10 --waitretry="$RETRY_WAIT" \
        --retry-connrefused --retry-on-http-error=429,500,502,503,504 --read-timeout=60 \
        --input-file=<(printf '%s\n' "$url") || true
    done
  fi
}

for ((round = 1; round <= MAX_ROUNDS && ${#pending[@]} > 0; round++)); do
  ((round == 1)) || say "Round $round: fetching ${#pending[@]} files again"
  failed=()
  for ((b = 0; b < ${#pending[@]}; b += BATCH)); do
    batch=("${pending[@]:b:BATCH}")
    declare -A size_before=()
    for i in "${batch[@]}"; do
      staged=$STAGING/${NAMES[$i]}
      size_before[$i]=$([[ -f $staged ]] && stat -c %s -- "$staged" || echo 0)
    done
    download_batch "${batch[@]}"
    while read -r i res; do
      staged=$STAGING/${NAMES[$i]}
      if [[ $res == ok ]]; then
        if dest=$(safe_dest "$i"); then
          mv -f -- "$staged" "$dest"
          rm -f -- "$staged.aria2"
          record_verified "$i"
          n_fetched=$((n_fetched + 1))
        else
          warn "refusing to write ${NAMES[$i]}: its folder leads outside $LOCAL_DIR (a symlink?)"
          failed+=("$i")
        fi
      elif [[ $res == bad ]]; then
        warn "${NAMES[$i]}: size or hash does not match the hub's; discarding it"
        rm -f -- "$staged" "$staged.aria2"
        failed+=("$i")
      else
        failed+=("$i") # incomplete: kept, the next round continues it
        # A partial file that did not grow could not be resumed: the server ignores ranges
        # (aria2c then refuses, "Invalid range header"). The next round starts it over.
        if ((size_before[$i] > 0)) && [[ -f $staged ]] && (($(stat -c %s -- "$staged") == size_before[$i])); then
          warn "${NAMES[$i]}: could not resume (the server may not support ranges); starting it over"
          rm -f -- "$staged" "$staged.aria2"
        fi
      fi
    done < <(check_files "$STAGING" "${batch[@]}")
    unset size_before
    save_state
    say "Progress: $((n_present + n_fetched))/${#NAMES[@]} files verified, ${#failed[@]} to retry"
  done
  pending=("${failed[@]}")
done

n_failed=${#pending[@]}
for i in "${pending[@]}"; do warn "failed: ${NAMES[$i]}"; done
say "Summary: ${#NAMES[@]} files: $n_present already ok, $n_fetched fetched, $n_failed failed, $N_REFUSED refused."
say "Files are in $LOCAL_DIR"
if ((n_failed + N_REFUSED)); then
  ((n_failed == 0)) || say "Run the same command again to retry the failed files."
  exit 1
fi
exit 0
