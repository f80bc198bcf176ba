{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "agentstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: <release>-<chart> unless the release name already contains it. */}}
{{- define "agentstream.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "agentstream.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "agentstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: agentstream
{{- end }}

{{/* Selector labels of every pod of this release (any component). */}}
{{- define "agentstream.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selector labels of one component: include "agentstream.componentSelectorLabels" (list $ "journal") */}}
{{- define "agentstream.componentSelectorLabels" -}}
{{ include "agentstream.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* All labels of one component's objects. */}}
{{- define "agentstream.componentLabels" -}}
{{ include "agentstream.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "agentstream.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}

{{- define "agentstream.configMapName" -}}
{{ include "agentstream.fullname" . }}-settings
{{- end }}

{{/* The CA bundle's mount directory (kafka.tls.caSecret). */}}
{{- define "agentstream.caDir" -}}
/etc/agentstream/kafka-ca
{{- end }}

{{/*
The LLM model and transport, resolved with the app's own rules (pipeline/settings.py) so that the
journal processor, which never sees the API key, renders requests the way the caller sends them.
*/}}
{{- define "agentstream.llmModel" -}}
{{- if .Values.llm.model }}{{ .Values.llm.model }}
{{- else if .Values.openai.existingSecret }}gpt-4o-mini
{{- else }}smollm2
{{- end }}
{{- end }}

{{- define "agentstream.llmTransport" -}}
{{- if .Values.llm.transport }}{{ .Values.llm.transport }}
{{- else if and .Values.openai.existingSecret (not .Values.llm.baseUrl) }}openai
{{- else }}openai-compatible
{{- end }}
{{- end }}

{{/*
The non-secret settings as a YAML map of environment variables: the ConfigMap's data, and the
topics Job's env (a pre-install hook runs before the ConfigMap exists).
*/}}
{{- define "agentstream.settings" -}}
AGENTSTREAM_BOOTSTRAP_SERVERS: {{ required "kafka.bootstrapServers is required" .Values.kafka.bootstrapServers | quote }}
AGENTSTREAM_TOPIC_PREFIX: {{ .Values.kafka.topicPrefix | quote }}
AGENTSTREAM_PARTITIONS: {{ .Values.kafka.partitions | int | quote }}
AGENTSTREAM_REPLICATION_FACTOR: {{ .Values.kafka.replicationFactor | int | quote }}
AGENTSTREAM_SECURITY_PROTOCOL: {{ .Values.kafka.securityProtocol | quote }}
AGENTSTREAM_SESSION_TIMEOUT_S: {{ .Values.kafka.sessionTimeoutSeconds | toString | quote }}
{{- with .Values.kafka.sasl.mechanism }}
AGENTSTREAM_SASL_MECHANISM: {{ . | quote }}
{{- end }}
{{- if .Values.kafka.tls.caSecret }}
AGENTSTREAM_SSL_CAFILE: {{ printf "%s/%s" (include "agentstream.caDir" .) .Values.kafka.tls.caKey | quote }}
{{- end }}
AGENTSTREAM_APP_ID: {{ .Values.journal.appId | quote }}
AGENTSTREAM_TRANSACTIONS: {{ .Values.journal.transactions | toString | quote }}
AGENTSTREAM_DATA_DIR: {{ .Values.journal.dataDir | quote }}
AGENTSTREAM_WORKER_PORT: {{ .Values.journal.webPort | int | quote }}
AGENTSTREAM_WORKER_BIND: {{ required "journal.webBind is required" .Values.journal.webBind | quote }}
AGENTSTREAM_ROCKSDB_WRITE_BUFFER_MB: {{ .Values.journal.rocksdbWriteBufferMb | int | quote }}
AGENTSTREAM_ROCKSDB_BLOCK_CACHE_MB: {{ .Values.journal.rocksdbBlockCacheMb | int | quote }}
AGENTSTREAM_MAX_CACHED_STREAMS: {{ .Values.journal.maxCachedStreams | int | quote }}
AGENTSTREAM_CALLER_GROUP: {{ .Values.caller.group | quote }}
AGENTSTREAM_LOG_LEVEL: {{ .Values.logLevel | quote }}
AGENTSTREAM_METRICS_PORT: {{ .Values.metrics.port | int | quote }}
AGENTSTREAM_CALLER_METRICS_PORT: {{ .Values.metrics.port | int | quote }}
AGENTSTREAM_METRICS_HOST: {{ required "metrics.host is required" .Values.metrics.host | quote }}
{{- with .Values.llm.baseUrl }}
AGENTSTREAM_OPENAI_BASE_URL: {{ . | quote }}
{{- end }}
AGENTSTREAM_LLM_MODEL: {{ include "agentstream.llmModel" . | quote }}
AGENTSTREAM_LLM_TRANSPORT: {{ include "agentstream.llmTransport" . | quote }}
AGENTSTREAM_LLM_MAX_IN_FLIGHT: {{ .Values.llm.maxInFlight | int | quote }}
AGENTSTREAM_LLM_TIMEOUT_S: {{ .Values.llm.timeoutSeconds | toString | quote }}
AGENTSTREAM_LLM_MAX_TOKENS: {{ .Values.llm.maxTokens | int | quote }}
{{- with .Values.llm.contextTokens }}
AGENTSTREAM_LLM_CONTEXT_TOKENS: {{ toJson . | quote }}
{{- end }}
AGENTSTREAM_LLM_DEFAULT_CONTEXT_TOKENS: {{ .Values.llm.defaultContextTokens | int | quote }}
{{- with .Values.blobStore.s3.bucket }}
AGENTSTREAM_BLOB_S3_BUCKET: {{ . | quote }}
AGENTSTREAM_BLOB_S3_PREFIX: {{ $.Values.blobStore.s3.prefix | quote }}
{{- with $.Values.blobStore.s3.endpoint }}
AGENTSTREAM_BLOB_S3_ENDPOINT: {{ . | quote }}
{{- end }}
{{- with $.Values.blobStore.s3.region }}
AGENTSTREAM_BLOB_S3_REGION: {{ . | quote }}
{{- end }}
{{- end }}
{{- with .Values.tracing.otlpEndpoint }}
OTEL_EXPORTER_OTLP_ENDPOINT: {{ . | quote }}
OTEL_TRACES_SAMPLER: {{ $.Values.tracing.sampler | quote }}
OTEL_TRACES_SAMPLER_ARG: {{ $.Values.tracing.samplerArg | toString | quote }}
{{- end }}
{{- with .Values.tracing.jaegerUiUrl }}
AGENTSTREAM_JAEGER_UI_URL: {{ . | quote }}
{{- end }}
{{- end }}

{{/* The blob store's S3 keys from blobStore.s3.existingSecret (env entries; empty without it). */}}
{{- define "agentstream.blobSecretEnv" -}}
{{- if and .Values.blobStore.s3.bucket .Values.blobStore.s3.existingSecret -}}
- name: AGENTSTREAM_BLOB_S3_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.blobStore.s3.existingSecret }}
      key: {{ .Values.blobStore.s3.accessKeyIdKey }}
- name: AGENTSTREAM_BLOB_S3_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.blobStore.s3.existingSecret }}
      key: {{ .Values.blobStore.s3.secretAccessKeyKey }}
{{- end }}
{{- end }}

{{/* Kafka SASL credentials from kafka.sasl.existingSecret (env entries; empty without it). */}}
{{- define "agentstream.kafkaSecretEnv" -}}
{{- with .Values.kafka.sasl.existingSecret -}}
- name: AGENTSTREAM_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.kafka.sasl.usernameKey }}
- name: AGENTSTREAM_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.kafka.sasl.passwordKey }}
{{- end }}
{{- end }}

{{/* Volumes every pod has: /tmp, and the Kafka CA bundle when kafka.tls.caSecret is set. */}}
{{- define "agentstream.commonVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpSizeLimit }}
{{- with .Values.kafka.tls.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ . }}
    defaultMode: 0444
    items:
      - key: {{ $.Values.kafka.tls.caKey }}
        path: {{ $.Values.kafka.tls.caKey }}
{{- end }}
{{- end }}

{{- define "agentstream.commonVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.kafka.tls.caSecret }}
- name: kafka-ca
  mountPath: {{ include "agentstream.caDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Refuses values that would deploy something that cannot work. */}}
{{- define "agentstream.validate" -}}
{{- $protocol := .Values.kafka.securityProtocol }}
{{- if not (has $protocol (list "PLAINTEXT" "SSL" "SASL_PLAINTEXT" "SASL_SSL")) }}
{{- fail (printf "kafka.securityProtocol must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (got %q)" $protocol) }}
{{- end }}
{{- if and .Values.kafka.tls.caSecret (not (hasSuffix "SSL" $protocol)) }}
{{- fail (printf "kafka.tls.caSecret is set but kafka.securityProtocol is %s: use SSL or SASL_SSL" $protocol) }}
{{- end }}
{{- if and .Values.kafka.sasl.existingSecret (not (hasPrefix "SASL_" $protocol)) }}
{{- fail (printf "kafka.sasl.existingSecret is set but kafka.securityProtocol is %s: use SASL_SSL or SASL_PLAINTEXT" $protocol) }}
{{- end }}
{{- if and .Values.kafka.sasl.existingSecret (not .Values.kafka.sasl.mechanism) }}
{{- fail "kafka.sasl.existingSecret is set but kafka.sasl.mechanism is empty: set PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512" }}
{{- end }}
{{- if and (hasPrefix "SASL_" $protocol) (not .Values.kafka.sasl.existingSecret) }}
{{- fail (printf "kafka.securityProtocol is %s but kafka.sasl.existingSecret is empty: name the Secret with the SASL credentials" $protocol) }}
{{- end }}
{{- if lt (int .Values.kafka.partitions) 1 }}
{{- fail "kafka.partitions must be at least 1" }}
{{- end }}
{{- with .Values.llm.transport }}
{{- if not (has . (list "openai" "openai-compatible")) }}
{{- fail (printf "llm.transport must be openai, openai-compatible or empty (got %q)" .) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod-level settings shared by every pod. */}}
{{- define "agentstream.podCommon" -}}
{{- with .Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}
