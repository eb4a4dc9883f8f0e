#!/usr/bin/env bash
# pki.sh: a certificate authority and the certificates an APapo cluster's
# control plane uses (TLS for the coordinator, client certificates for the
# worker daemons), made with openssl.
#
#   deploy/pki.sh DIR [--server-name=NAME]... [--worker=ID]... [--days=N]
#
# Writes into DIR (created, mode 0700):
#   ca.pem, ca.key                  the cluster CA (keep ca.key offline)
#   coordinator.pem, coordinator.key  server certificate; its subject
#                                   alternative names are localhost,
#                                   127.0.0.1 and every --server-name (a
#                                   DNS name, or an IP address)
#   worker-ID.pem, worker-ID.key    one client certificate per --worker,
#                                   common name ID: the coordinator accepts
#                                   a registration only under that id
# Existing files are kept (run it again to add workers). Keys are 0600.
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

dir=${1:-}
[ -n "$dir" ] && [[ "$dir" != --* ]] || usage
shift
names=()
workers=()
days=825
for arg in "$@"; do
  case "$arg" in
    --server-name=*) names+=("${arg#*=}") ;;
    --worker=*) workers+=("${arg#*=}") ;;
    --days=*) days=${arg#*=} ;;
    *) echo "pki.sh: unknown argument $arg" >&2; usage ;;
  esac
done
command -v openssl >/dev/null || { echo "pki.sh: openssl is needed" >&2; exit 1; }
for w in "${workers[@]}"; do
  [[ "$w" =~ ^[A-Za-z0-9._-]{1,64}$ ]] ||
    { echo "pki.sh: worker id \"$w\" must be 1-64 of [A-Za-z0-9._-]" >&2; exit 2; }
done

umask 077
mkdir -p "$dir"
cd "$dir"

if [ ! -f ca.pem ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout ca.key -out ca.pem -days "$days" -subj "/CN=APapo cluster CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

# sign NAME CN EXTFILE: NAME.key and NAME.pem signed by the CA.
sign() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$2" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
    -out "$1.pem" -days "$days" -extfile "$3" 2>/dev/null
  rm -f "$1.csr" "$3"
}

if [ ! -f coordinator.pem ]; then
  san="DNS:localhost,IP:127.0.0.1"
  for n in "${names[@]}"; do
    if [[ "$n" =~ ^[0-9.]+$ || "$n" == *:* ]]; then san+=",IP:$n"; else san+=",DNS:$n"; fi
  done
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n' \
    "$san" > coordinator.ext
  sign coordinator apapo-coordinator coordinator.ext
fi

for w in "${workers[@]}"; do
  [ -f "worker-$w.pem" ] && continue
  printf 'extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n' > "worker-$w.ext"
  sign "worker-$w" "$w" "worker-$w.ext"
done
chmod 0644 ./*.pem
echo "pki.sh: CA and certificates in $dir"
