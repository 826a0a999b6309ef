#!/usr/bin/env python3
"""Checks docker/compose.yaml without a Docker engine (needs PyYAML): every service has an
image, an exec-form health check and loopback-only ports that do not collide; volumes are
declared; every port in docker/env is published to a server of the right kind; the etcd
members agree on the initial cluster.  Usage: python3 docker/check-compose.py"""
import os
import re

import yaml

here = os.path.dirname(os.path.abspath(__file__))
c = yaml.safe_load(open(os.path.join(here, 'compose.yaml')))
env = dict(l.strip().split('=',1) for l in open(os.path.join(here, 'env')) if l.strip() and not l.startswith('#'))
ports = {}
for name, s in c['services'].items():
    assert 'image' in s, name
    hc = s['healthcheck']; assert hc['test'][0] == 'CMD', name
    for p in s['ports']:
        ip, host, cont = p.split(':'); assert ip == '127.0.0.1'
        assert host not in ports, host; ports[host] = (name, cont)
    for v in s.get('volumes', []):
        assert v.split(':')[0] in c['volumes'], v
    print(f"{name:9} {s['image']:30} ports={s['ports']} cmd={s.get('command')}")
# every port the env file names is published, to the right kind of server
for k, v in env.items():
    for hp in re.findall(r'127\.0\.0\.1:(\d+)', v):
        assert hp in ports, (k, hp)
        name, cont = ports[hp]
        kind = {'REDIS': '6379', 'REDLOCK': '6379', 'POSTGRES': '5432', 'ETCD': '2379'}
        want = next(v for w, v in kind.items() if k.startswith('LEASEHOLD_TEST_' + w))
        assert cont == want, (k, hp, name, cont)
        print(k, hp, '->', name, cont)
# etcd cluster consistency
members = {n for n in c['services'] if n.startswith('etcd-')}
for n in members:
    s = c['services'][n]
    cl = s['environment']['ETCD_INITIAL_CLUSTER']
    assert all(f'{m}=http://{m}:2380' in cl for m in members)
    assert f'--name={n}' in s['command'] and s['hostname'] == n
print('ok:', len(c['services']), 'services')
