#!/bin/bash
# minio server DIR [--address HOST:PORT] [--console-address ...]: moto_server on HOST:PORT.
set -euo pipefail
[[ ${1:-} == minio ]] && shift  # as the official image, with or without the program's name
[[ ${1:-} == server ]] || { echo "usage: minio server DIR [--address HOST:PORT]" >&2; exit 2; }
shift
address=127.0.0.1:9000
while [[ $# -gt 0 ]]; do
    case $1 in
        --address) address=$2; shift 2 ;;
        --address=*) address=${1#*=}; shift ;;
        --console-address) shift 2 ;;
        --console-address=*|--*) shift ;;
        *) shift ;;  # the data folder: moto keeps everything in memory
    esac
done
host=${address%:*}
exec /opt/moto/bin/moto_server -H "${host:-0.0.0.0}" -p "${address##*:}"
