// forty-first session: one core's FMA throughput (gcc -O2 -mavx2 -mfma fma_mb.c), alone and on both CPUs at once
#include <stdio.h>
#include <time.h>
#include <immintrin.h>
int main(){ struct timespec a,b; long n=300000000L;
__m256 x0=_mm256_set1_ps(1),x1=x0,x2=x0,x3=x0,x4=x0,x5=x0,x6=x0,x7=x0,m=_mm256_set1_ps(0.999f),c=_mm256_set1_ps(0.001f);
clock_gettime(CLOCK_MONOTONIC,&a);
for(long i=0;i<n;i++){ x0=_mm256_fmadd_ps(x0,m,c);x1=_mm256_fmadd_ps(x1,m,c);x2=_mm256_fmadd_ps(x2,m,c);x3=_mm256_fmadd_ps(x3,m,c);
x4=_mm256_fmadd_ps(x4,m,c);x5=_mm256_fmadd_ps(x5,m,c);x6=_mm256_fmadd_ps(x6,m,c);x7=_mm256_fmadd_ps(x7,m,c); __asm__ volatile("" : "+x"(x0),"+x"(x1),"+x"(x2),"+x"(x3),"+x"(x4),"+x"(x5),"+x"(x6),"+x"(x7));}
clock_gettime(CLOCK_MONOTONIC,&b);
double s=(b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)*1e-9; float o[8]; _mm256_storeu_ps(o,_mm256_add_ps(x0,x7));
printf("%.2f G fma/s  %f\n", 8.0*n/s/1e9, o[0]); return 0;}
